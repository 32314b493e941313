#!/usr/bin/env python3
"""Prints 'N passed, N failed' for the test targets of one `bazel test` run.

Reads Bazel's summary lines from the run's log, so only the targets of this
run count (cached results included). For a target that ran, every gtest case
in its test.xml counts; a target that did not build, did not run, or timed
out counts as one failure, so a broken target can never look green.

    count_tests.py --log bazel_test.log --testlogs "$(bazel info bazel-testlogs)" [--steps STEPS.tsv]

--steps: the checks tools/test.sh runs outside Bazel (the container images),
one "NAME<TAB>passed|failed<TAB>SECONDS<TAB>DETAIL" line each; each counts as
one case. A check listed as failed, or any other verdict, is a failure.
"""
import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET

SUMMARY = re.compile(r"^(//\S+)\s+(?:\(cached\) )?(PASSED|FAILED|FLAKY|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE|SKIPPED)\b")


def count_cases(xml_path):
    """(passed, failed) test cases in one test.xml, or None if unreadable."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    passed = failed = 0
    cases = list(root.iter("testcase"))
    for case in cases:
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("status", "run") == "run" and case.get("result", "completed") == "completed":
            passed += 1
    if not cases:  # a non-gtest test: its suite's counts are the verdict
        bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in root.iter("testsuite"))
        return (0, 1) if bad else (1, 0)
    return passed, failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--testlogs", required=True)
    ap.add_argument("--steps", help="checks run outside Bazel (NAME, passed|failed, ...)")
    args = ap.parse_args()
    passed = failed = 0
    seen = set()
    with open(args.log, errors="replace") as log:
        for line in log:
            m = SUMMARY.match(line.strip())
            if not m or m.group(1) in seen:
                continue
            target, verdict = m.groups()
            seen.add(target)
            if verdict == "SKIPPED":
                continue
            if verdict in ("PASSED", "FAILED", "FLAKY"):
                package, name = target[2:].split(":")
                counts = count_cases(os.path.join(args.testlogs, package, name, "test.xml"))
                if counts is None:
                    counts = (1, 0) if verdict != "FAILED" else (0, 1)
                if verdict == "FAILED" and counts[1] == 0:
                    counts = (counts[0], 1)  # crashed after its cases passed
                passed += counts[0]
                failed += counts[1]
            else:
                failed += 1
    if args.steps and os.path.exists(args.steps):
        with open(args.steps, errors="replace") as steps:
            for line in steps:
                fields = line.rstrip("\n").split("\t")
                if len(fields) < 2:
                    continue
                if fields[1] == "passed":
                    passed += 1
                else:
                    failed += 1
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
