#!/usr/bin/env python3
"""Fails when a GoogleTest case of this build runs under no ctest entry: every ctest command
that runs a gtest binary with --gtest_filter is read from `ctest -N --show-only=json-v1`,
and each binary's listed tests must match one of its filters (a test written but never
registered in tests/CMakeLists.txt would otherwise pass CI unseen). PATTERNs name tests this
build leaves out on purpose (the sanitizer build skips the model zoo). It also fails when a
ctest entry lacks SKIP_RETURN_CODE 77, the code of a run whose every case skipped
(tests/gtest_main.cpp; without it ctest would report such a run as Passed).
Usage: every_test_registered.py BUILD_DIR [PATTERN...]"""
import fnmatch
import json
import os
import subprocess
import sys

build, skipped = sys.argv[1], sys.argv[2:]
shown = json.loads(subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                                  capture_output=True, text=True).stdout)


def matches(name, gtest_filter):
    positive, _, negative = gtest_filter.partition("-")
    hit = any(fnmatch.fnmatchcase(name, p) for p in positive.split(":") if p)
    return hit and not any(fnmatch.fnmatchcase(name, p) for p in negative.split(":") if p)


filters = {}  # binary -> its filters (a run without one covers the whole binary)
for test in shown["tests"]:
    command = test.get("command") or []
    if not command or not os.path.basename(command[0]).startswith("tandem_") or not command[0].endswith("_tests"):
        continue
    f = next((a.split("=", 1)[1] for a in command[1:] if a.startswith("--gtest_filter=")), "*")
    filters.setdefault(command[0], []).append(f)

no_skip_code = []
for test in shown["tests"]:
    props = {p["name"]: p["value"] for p in test.get("properties", [])}
    if props.get("SKIP_RETURN_CODE") != 77:
        no_skip_code.append(test["name"])

missing = []
for binary, fs in sorted(filters.items()):
    listed = subprocess.run([binary, "--gtest_list_tests"], check=True, capture_output=True, text=True).stdout
    suite = ""
    for line in listed.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.strip()
            continue
        name = suite + line.strip().split()[0]
        if name.startswith("DISABLED_") or ".DISABLED_" in name:
            continue
        if not any(matches(name, f) for f in fs) and not any(fnmatch.fnmatchcase(name, p) for p in skipped):
            missing.append(f"{os.path.basename(binary)}: {name}")

print(f"{len(filters)} test binaries checked")
if no_skip_code:
    print("these ctest entries would report a run that only skipped as Passed: tests/CMakeLists.txt's last")
    print("lines give every entry SKIP_RETURN_CODE 77; set it on entries made after them:")
    for t in no_skip_code:
        print("  " + t)
if missing:
    print("these GoogleTest cases run under no ctest entry; register them in tests/CMakeLists.txt:")
    for m in missing:
        print("  " + m)
if missing or no_skip_code:
    sys.exit(1)
