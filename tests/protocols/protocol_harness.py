"""A real vaedecode_server for the protocol tests: its binaries from the
Bazel runfiles, a model repository of diffusers fixtures, free ports read
from its ready file, and a drain on SIGTERM that must exit 0."""

import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET

RUNFILES = pathlib.Path(os.environ["TEST_SRCDIR"]) / "vaedecode"
TMP = pathlib.Path(os.environ["TEST_TMPDIR"])
FIXTURES = pathlib.Path(os.environ["TEST_SRCDIR"]) / "diffusers_fixtures"
SERVER = RUNFILES / "server" / "vaedecode_server"
WORKER = RUNFILES / "worker" / "vaedecode_worker"
CLIENT = RUNFILES / "client" / "vaedecode_client"


def expect_oip_error(fn, *needles):
    """Runs an OIP call (tritonclient) that must fail; its status and message
    must hold every needle. Returns them."""
    from tritonclient.utils import InferenceServerException  # the OIP tests' venv only

    try:
        fn()
    except InferenceServerException as e:
        text = f"{e.status()} {e.message()}"
        for needle in needles:
            assert needle in text, f"{needle!r} not in {text!r}"
        return text
    raise AssertionError("the bad request succeeded")


def fixture(name, file=""):
    return FIXTURES / name / file if file else FIXTURES / name


class Server:
    def __init__(self, models, extra_flags=(), devices="cpu:2", group_size=2):
        """models: {served name: fixture folder name, or a model folder's path}."""
        self.repo = TMP / "models"
        self.repo.mkdir(exist_ok=True)
        for name, folder in models.items():
            link = self.repo / name
            if not link.exists():
                link.symlink_to(folder if isinstance(folder, pathlib.Path) else fixture(folder))
        os.environ["HOME"] = str(TMP / "home")  # decode-peak profiles
        (TMP / "home").mkdir(exist_ok=True)
        self.ready = TMP / "server.ready"
        self.ready.unlink(missing_ok=True)
        self.log_path = TMP / "server.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [str(SERVER), f"--devices={devices}", f"--group_size={group_size}", "--listen=127.0.0.1:0",
             "--metrics_listen=127.0.0.1:0", "--http_listen=127.0.0.1:0", f"--model_repository={self.repo}",
             f"--ready_file={self.ready}", f"--worker_binary={WORKER}", *extra_flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        ports = self._wait_ready()
        self.grpc = f"127.0.0.1:{ports['grpc_port']}"
        self.http = f"http://127.0.0.1:{ports['http_port']}"
        self.metrics = f"http://127.0.0.1:{ports['metrics_port']}/metrics"
        for name in models:
            self.wait_model(name)

    def _wait_ready(self):
        for _ in range(300):
            if self.ready.exists() and self.ready.stat().st_size > 0:
                return dict(line.split("=", 1) for line in self.ready.read_text().split())
            if self.proc.poll() is not None:
                self.fail("vaedecode_server exited at start")
            time.sleep(0.1)
        self.fail("vaedecode_server did not listen within 30 s")

    def wait_model(self, name, timeout_s=180):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.http}/health/{name}", timeout=5) as r:
                    if r.read() == b"Ok":
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                self.fail("vaedecode_server exited before serving")
            time.sleep(0.5)
        self.fail(f"model {name} was not served within {timeout_s} s")

    def client(self, *args):
        """The C++ vaedecode_client over gRPC: the reference path."""
        done = subprocess.run([str(CLIENT), f"--server={self.grpc}", *args], capture_output=True, text=True)
        if done.returncode != 0:
            self.fail(f"vaedecode_client {' '.join(args)}: {done.stderr}")
        return done.stdout

    def scrape(self):
        with urllib.request.urlopen(self.metrics, timeout=10) as r:
            return r.read().decode()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        self.log.close()
        if rc != 0:
            self.fail(f"vaedecode_server exited {rc} after SIGTERM")
        for line in self.log_path.read_text().splitlines():
            if "[warning]" in line or "[error]" in line:
                self.fail(f"the server logged: {line}")

    def fail(self, message):
        print(f"FAIL: {message}", file=sys.stderr)
        if self.log_path.exists():
            print("--- server log (tail)", file=sys.stderr)
            print("\n".join(self.log_path.read_text().splitlines()[-30:]), file=sys.stderr)
        if self.proc.poll() is None:
            self.proc.kill()
        sys.exit(1)


class Checks:
    """Named checks, run in order; prints 'N passed, N failed' at the end."""

    def __init__(self, suite):
        self.suite = suite
        self.passed = 0
        self.failed = 0
        self.cases = []  # (name, seconds, failure message or None)

    def run(self, name, fn):
        # VAEDECODE_CHECKS=a,b runs only the checks whose names contain a or b
        # (e.g. to show one check failing against an older server).
        only = [c for c in os.environ.get("VAEDECODE_CHECKS", "").split(",") if c]
        if only and not any(c in name for c in only):
            return
        start = time.time()
        try:
            fn()
        except Exception as e:  # a failed check is reported, the others still run
            self.failed += 1
            message = f"{type(e).__name__}: {e}"
            self.cases.append((name, time.time() - start, message))
            print(f"[FAILED] {name}: {message}", flush=True)
            return
        self.passed += 1
        self.cases.append((name, time.time() - start, None))
        print(f"[ok] {name}", flush=True)

    def finish(self):
        """Prints the counts and writes them as JUnit XML where Bazel reads it,
        so each check counts as a test case."""
        print(f"{self.passed} passed, {self.failed} failed")
        xml_path = os.environ.get("XML_OUTPUT_FILE")
        if xml_path:
            suite = ET.Element("testsuite", name=self.suite, tests=str(len(self.cases)), failures=str(self.failed))
            for name, seconds, failure in self.cases:
                case = ET.SubElement(suite, "testcase", name=name, classname=self.suite, time=f"{seconds:.3f}")
                if failure is not None:
                    ET.SubElement(case, "failure", message=failure)
            root = ET.Element("testsuites")
            root.append(suite)
            ET.ElementTree(root).write(xml_path, encoding="utf-8", xml_declaration=True)
        return 0 if self.failed == 0 else 1
