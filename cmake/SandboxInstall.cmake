# Install the library, its headers, the CLI, and a relocatable CMake package (export set +
# sandboxConfig.cmake + version file), plus a build-tree export for use without installing.
include(CMakePackageConfigHelpers)

install(TARGETS sandbox sandbox_testing EXPORT sandboxTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS sandboxctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/sandbox DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(SANDBOX_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/sandbox)
install(EXPORT sandboxTargets NAMESPACE sandbox:: DESTINATION ${SANDBOX_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/sandboxConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sandboxConfig.cmake INSTALL_DESTINATION ${SANDBOX_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sandboxConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sandboxConfig.cmake
              ${PROJECT_BINARY_DIR}/sandboxConfigVersion.cmake
        DESTINATION ${SANDBOX_CMAKE_DIR})
export(EXPORT sandboxTargets NAMESPACE sandbox:: FILE ${PROJECT_BINARY_DIR}/sandboxTargets.cmake)
