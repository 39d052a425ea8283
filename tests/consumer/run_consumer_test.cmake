# Driver of the consumer tests (cmake -P). Everything it writes goes under WORK_DIR (in the
# build tree); the source tree is only read.
#
#   cmake -DMODE=find_package|fetch_content -DSOURCE_DIR=<checkout> -DWORK_DIR=<dir>
#         [-DBUILT_TREE=<build dir> [-DBUILT_TREE_TYPE=<its build type>]]
#         [-DBUILD_TYPE=Release [-DBUILD_TYPE_FLAGS=<that type's C/C++ flags>]] [-DJOBS=2]
#         [-DGENERATOR=...] [-DCXX_COMPILER=...]
#         [-DC_COMPILER=...] -P run_consumer_test.cmake
#
# find_package: with BUILT_TREE (a build tree of SOURCE_DIR with install rules), brings the
#   targets it installs up to date (a no-op after a full build) and installs it into
#   WORK_DIR/prefix; without, configures, builds and installs agent-sandbox alone (no tests,
#   examples or benchmarks) from source. Then checks the installed files, configures and
#   builds tests/consumer/find_package against that prefix only, and runs its two programs.
# fetch_content: configures tests/consumer/fetch_content, which pulls this checkout in with
#   FetchContent (SOURCE_DIR: nothing is downloaded), builds its two programs (and so only the
#   parts of agent-sandbox they link), and runs them.
#
# Build directories are kept between runs (incremental builds); the install prefix and the
# find_package consumer's build directory are made afresh each time.
cmake_minimum_required(VERSION 3.25)

foreach(var MODE SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer_test.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT MODE MATCHES "^(find_package|fetch_content)$")
  message(FATAL_ERROR "run_consumer_test.cmake: MODE must be find_package or fetch_content")
endif()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
if(NOT JOBS)
  set(JOBS 2)
endif()

set(common_args -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
                # Only what we pass may be found: no user or system package registry.
                -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
                -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
if(BUILD_TYPE_FLAGS)
  string(TOUPPER "${BUILD_TYPE}" type_upper)
  list(APPEND common_args "-DCMAKE_CXX_FLAGS_${type_upper}=${BUILD_TYPE_FLAGS}"
       "-DCMAKE_C_FLAGS_${type_upper}=${BUILD_TYPE_FLAGS}")
endif()
if(GENERATOR)
  list(APPEND common_args -G "${GENERATOR}")
endif()
if(CXX_COMPILER)
  list(APPEND common_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(C_COMPILER)
  list(APPEND common_args -DCMAKE_C_COMPILER=${C_COMPILER})
endif()

# Runs a command from WORK_DIR, echoing it; fails the test when it fails.
function(step what)
  message(STATUS "consumer ${MODE}: ${what}")
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc
                  COMMAND_ECHO STDOUT)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer ${MODE}: ${what} failed (${rc})")
  endif()
endfunction()

file(MAKE_DIRECTORY "${WORK_DIR}")
set(consumer_build "${WORK_DIR}/consumer")

if(MODE STREQUAL "find_package")
  set(prefix "${WORK_DIR}/prefix")
  file(REMOVE_RECURSE "${prefix}" "${consumer_build}")
  if(BUILT_TREE)
    # The tree the test itself belongs to: what `cmake --install` copies is what it built.
    set(lib_build "${BUILT_TREE}")
    step("bring the installed targets of ${lib_build} up to date"
         ${CMAKE_COMMAND} --build "${lib_build}" --target sandbox sandbox_testing sandboxctl
         -j ${JOBS})
    step("install agent-sandbox from ${lib_build}"
         ${CMAKE_COMMAND} --install "${lib_build}" --prefix "${prefix}")
    # The consumer asks for the configuration the tree was built in (the installed targets
    # hold only that one).
    if(BUILT_TREE_TYPE)
      list(TRANSFORM common_args REPLACE "^-DCMAKE_BUILD_TYPE=.*" "-DCMAKE_BUILD_TYPE=${BUILT_TREE_TYPE}")
    endif()
  else()
    set(lib_build "${WORK_DIR}/build")
    step("configure agent-sandbox"
         ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${lib_build}" ${common_args}
         -DSANDBOX_BUILD_TESTS=OFF -DSANDBOX_BUILD_EXAMPLES=OFF -DSANDBOX_BUILD_BENCH=OFF
         -DSANDBOX_INSTALL=ON "-DCMAKE_INSTALL_PREFIX=${prefix}")
    step("build agent-sandbox" ${CMAKE_COMMAND} --build "${lib_build}" -j ${JOBS})
    step("install agent-sandbox" ${CMAKE_COMMAND} --install "${lib_build}")
  endif()

  # What an installed package must hold, and what it must not.
  file(GLOB_RECURSE config_files "${prefix}/*/sandboxConfig.cmake")
  list(LENGTH config_files n_config)
  if(NOT n_config EQUAL 1)
    message(FATAL_ERROR "consumer find_package: expected one sandboxConfig.cmake, found: ${config_files}")
  endif()
  get_filename_component(config_dir "${config_files}" DIRECTORY)
  foreach(f sandboxConfig.cmake sandboxConfigVersion.cmake sandboxTargets.cmake)
    if(NOT EXISTS "${config_dir}/${f}")
      message(FATAL_ERROR "consumer find_package: ${config_dir}/${f} was not installed")
    endif()
  endforeach()
  foreach(f include/sandbox/sandbox.hpp include/sandbox/testing/fake_backend.hpp bin/sandboxctl)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "consumer find_package: ${prefix}/${f} was not installed")
    endif()
  endforeach()
  file(GLOB_RECURSE installed_libs "${prefix}/*/libagent-sandbox.a" "${prefix}/*/libagent-sandbox.so"
       "${prefix}/*/libagent-sandbox-testing.a" "${prefix}/*/libagent-sandbox-testing.so")
  list(LENGTH installed_libs n_libs)
  if(n_libs LESS 2)
    message(FATAL_ERROR "consumer find_package: libraries missing from the install: ${installed_libs}")
  endif()
  # Only the public API is installed: no private header, and no path back into the source or
  # build tree in the exported targets.
  file(GLOB_RECURSE installed_headers RELATIVE "${prefix}/include" "${prefix}/include/*")
  foreach(h IN LISTS installed_headers)
    if(NOT h MATCHES "^sandbox/")
      message(FATAL_ERROR "consumer find_package: unexpected installed header ${h}")
    endif()
  endforeach()
  file(GLOB target_files "${config_dir}/sandboxTargets*.cmake")
  foreach(f IN LISTS target_files)
    file(READ "${f}" content)
    foreach(forbidden "${SOURCE_DIR}" "${lib_build}")
      string(FIND "${content}" "${forbidden}" at)
      if(NOT at EQUAL -1)
        message(FATAL_ERROR "consumer find_package: ${f} refers to ${forbidden}")
      endif()
    endforeach()
  endforeach()
  step("installed sandboxctl runs" "${prefix}/bin/sandboxctl" --help)

  step("configure the consumer"
       ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer/find_package" -B "${consumer_build}"
       ${common_args} "-DCMAKE_PREFIX_PATH=${prefix}")
  file(READ "${consumer_build}/sandbox_dir.txt" found_dir)
  file(REAL_PATH "${found_dir}" found_dir)
  file(REAL_PATH "${config_dir}" config_dir)
  if(NOT found_dir STREQUAL config_dir)
    message(FATAL_ERROR "consumer find_package: sandbox was found in ${found_dir}, not in the staged install ${config_dir}")
  endif()
else()
  step("configure the consumer (FetchContent of ${SOURCE_DIR})"
       ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer/fetch_content" -B "${consumer_build}"
       ${common_args} "-DSANDBOX_SOURCE_DIR=${SOURCE_DIR}")
endif()

# Only the consumer's own programs: under FetchContent, agent-sandbox's other targets
# (sandboxctl) are not what a consumer builds.
step("build the consumer" ${CMAKE_COMMAND} --build "${consumer_build}" -j ${JOBS}
     --target consumer_core consumer_testing)
step("run consumer_core (sandbox::sandbox)" "${consumer_build}/consumer_core")
step("run consumer_testing (sandbox::testing)" "${consumer_build}/consumer_testing")
message(STATUS "consumer ${MODE}: ok")
