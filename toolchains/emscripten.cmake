# CMake toolchain for WebAssembly with Debian's Emscripten (package emscripten): em++ and
# its platform file. Run with NODE_PATH=/usr/share/nodejs in the environment (for acorn).
include(/usr/share/emscripten/cmake/Modules/Platform/Emscripten.cmake)
