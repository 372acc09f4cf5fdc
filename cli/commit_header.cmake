# Writes OUT: the commit SOURCE_DIR is checked out at (with "-dirty" when it has changes) and
# its date, for --version. Rewrites OUT only when that changes, so a build recompiles nothing else.
execute_process(COMMAND git -C "${SOURCE_DIR}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown (not built from a git checkout)")
endif()
execute_process(COMMAND git -C "${SOURCE_DIR}" log -1 --format=%cd --date=short
                OUTPUT_VARIABLE date OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(text "#define TANDEM_COMMIT \"${commit}\"\n#define TANDEM_COMMIT_DATE \"${date}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
