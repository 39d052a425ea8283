# Every dependency comes from Debian 12 packages; the build never downloads.
find_package(Boost 1.81 REQUIRED CONFIG COMPONENTS headers program_options)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.11 REQUIRED)
find_package(OpenSSL 3 REQUIRED COMPONENTS Crypto SSL)
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

# Precompiled headers (CMake's target_precompile_headers): the third-party headers that most
# translation units include and that take seconds each to parse (g++ 12, -fsyntax-only: Asio
# ≈4.5 s, nlohmann-json ≈2.8 s, Catch2 ≈1.8 s) are parsed once instead of once per file.
# Build speed only: every file compiles the same without them (SANDBOX_PCH=OFF), and each
# still includes what it uses.
#   sandbox_precompile_headers(<target> [DONOR] [headers...])
#                                                       its own PCH (the four below and
#                                                       <headers>); targets of fewer than
#                                                       three files gain nothing: none,
#                                                       unless others reuse it (DONOR);
#   sandbox_precompile_headers(<target> REUSE <donor>)  the donor's PCH, not one of its own
#                                                       (REUSE_FROM). Building a PCH takes
#                                                       10-14 s; one per group of targets
#                                                       compiled with the same flags (the
#                                                       library's rooms; the test programs)
#                                                       saved about 130 s of a fresh build's
#                                                       1620 core-seconds. A target whose
#                                                       flags differ from the donor's in what
#                                                       the headers use (-fPIC, -std,
#                                                       FMT_SHARED) would get a -Winvalid-pch
#                                                       warning and parse the headers itself.
option(SANDBOX_PCH "Precompile widely used third-party headers (build speed only)"
       ${PROJECT_IS_TOP_LEVEL})
function(sandbox_precompile_headers target)
  if(NOT SANDBOX_PCH)
    return()
  endif()
  cmake_parse_arguments(arg "DONOR" "REUSE" "" ${ARGN})
  if(arg_REUSE)
    target_precompile_headers(${target} REUSE_FROM ${arg_REUSE})
    return()
  endif()
  get_target_property(sources ${target} SOURCES)
  list(LENGTH sources count)
  if(count LESS 3 AND NOT arg_DONOR)
    return()
  endif()
  target_precompile_headers(${target} PRIVATE <boost/asio.hpp> <boost/system/result.hpp>
                            <nlohmann/json.hpp> <fmt/format.h> ${arg_UNPARSED_ARGUMENTS})
endfunction()
