# Cross-compiles for arm64 Linux with Debian's aarch64-linux-gnu-g++ (libc and libstdc++ from
# /usr/aarch64-linux-gnu) and the libraries of a sysroot made by toolchains/arm64-sysroot.sh.
# Host programs (flatc) come from the host. Set TANDEM_ARM64_SYSROOT (default build/arm64-sysroot).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

find_program(TANDEM_AARCH64_CXX aarch64-linux-gnu-g++)
find_program(TANDEM_AARCH64_CC aarch64-linux-gnu-gcc)
if(NOT TANDEM_AARCH64_CXX OR NOT TANDEM_AARCH64_CC)
  message(FATAL_ERROR "aarch64-linux-gnu-g++ is not installed: bash scripts/setup.sh installs it "
                      "(Debian g++-aarch64-linux-gnu)")
endif()
set(CMAKE_C_COMPILER ${TANDEM_AARCH64_CC})
set(CMAKE_CXX_COMPILER ${TANDEM_AARCH64_CXX})

if(NOT TANDEM_ARM64_SYSROOT)
  set(TANDEM_ARM64_SYSROOT "${CMAKE_CURRENT_LIST_DIR}/../build/arm64-sysroot")
endif()
get_filename_component(TANDEM_ARM64_SYSROOT "${TANDEM_ARM64_SYSROOT}" ABSOLUTE)
set(TANDEM_ARM64_SYSROOT "${TANDEM_ARM64_SYSROOT}" CACHE PATH "arm64 sysroot from toolchains/arm64-sysroot.sh")
if(NOT EXISTS "${TANDEM_ARM64_SYSROOT}/.sysroot-stamp")
  message(FATAL_ERROR "no arm64 sysroot at ${TANDEM_ARM64_SYSROOT}: run "
                      "bash toolchains/arm64-sysroot.sh ${TANDEM_ARM64_SYSROOT} (or bash scripts/build-arm64.sh)")
endif()
# Try-compiles configure with the same sysroot.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES TANDEM_ARM64_SYSROOT)

# Libraries, headers and CMake packages from the sysroot (and the cross libc); programs from
# the host.
set(CMAKE_FIND_ROOT_PATH "${TANDEM_ARM64_SYSROOT}" /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# The sysroot holds only these libraries' files (no libc headers), so its include folders go
# last, as system folders; the linker follows shared libraries' own dependencies there.
foreach(lang C CXX)
  set(CMAKE_${lang}_STANDARD_INCLUDE_DIRECTORIES "${TANDEM_ARM64_SYSROOT}/usr/include/aarch64-linux-gnu"
                                                 "${TANDEM_ARM64_SYSROOT}/usr/include")
endforeach()
set(_tandem_rpath_link
    "-Wl,-rpath-link,${TANDEM_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu -Wl,-rpath-link,${TANDEM_ARM64_SYSROOT}/lib/aarch64-linux-gnu")
set(CMAKE_EXE_LINKER_FLAGS_INIT "${_tandem_rpath_link}")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "${_tandem_rpath_link}")

# pkg-config reads the sysroot's .pc files and prefixes their paths with it.
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${TANDEM_ARM64_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR}
    "${TANDEM_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${TANDEM_ARM64_SYSROOT}/usr/share/pkgconfig")

# Test binaries run under qemu user emulation, loading libraries from the sysroot.
find_program(TANDEM_QEMU_AARCH64 qemu-aarch64-static)
if(TANDEM_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${TANDEM_QEMU_AARCH64};-L;${TANDEM_ARM64_SYSROOT}")
endif()
