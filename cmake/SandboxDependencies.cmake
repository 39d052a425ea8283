# Every dependency comes from Debian 12 packages; the build never downloads.
find_package(Boost 1.81 REQUIRED CONFIG COMPONENTS headers program_options)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.11 REQUIRED)
find_package(OpenSSL 3 REQUIRED COMPONENTS Crypto)
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(libseccomp REQUIRED IMPORTED_TARGET libseccomp>=2.5)

# Sanitizers are applied per target (never to sandbox-init or tests/helpers).
set(SANDBOX_SANITIZE "" CACHE STRING "Sanitizers for library, CLI and tests, e.g. address,undefined")
function(sandbox_apply_sanitizers target)
  if(SANDBOX_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${SANDBOX_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${SANDBOX_SANITIZE})
  endif()
endfunction()
