#!/usr/bin/env python3
"""Counts test cases from Bazel's test.xml files and prints 'N passed, N failed'.

A test target with no test.xml (failed to build, timed out, crashed before
writing it) counts as one failure, so a broken target can never look green.
"""
import os
import sys
import xml.etree.ElementTree as ET


def main(testlogs):
    passed = failed = 0
    for root, _, files in os.walk(testlogs):
        if "test.xml" not in files:
            if "test.log" in files:
                failed += 1
            continue
        try:
            tree = ET.parse(os.path.join(root, "test.xml")).getroot()
        except ET.ParseError:
            failed += 1
            continue
        cases = tree.iter("testcase")
        seen = False
        for case in cases:
            seen = True
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.get("status", "run") == "run" or case.get("result") == "completed":
                passed += 1
        if not seen:
            # A non-gtest test: Bazel writes one suite whose failure count is the verdict.
            failures = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in tree.iter("testsuite"))
            if failures:
                failed += 1
            else:
                passed += 1
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "bazel-testlogs"))
