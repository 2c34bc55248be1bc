"""A real cohort-coordinator and cohort-workers on loopback, for the Python example tests.

The Python counterpart of tests/integration/local_cluster.h. The coordinator listens on
127.0.0.1:0 (the kernel picks a free port, so two tests never race for one) and the bound
address is read from its start-up line ("... serving gRPC on 127.0.0.1:PORT, ...", documented in
docs/operations.md). Every process gets its own log in the cluster's temporary folder, is
killed with SIGKILL if the test process dies (PR_SET_PDEATHSIG), and is killed by PID in
close(), which the tests call in a finally or class cleanup. Every wait is bounded.

Not thread-safe: one test thread drives a cluster.
"""

import argparse
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

# ctest's SKIP_RETURN_CODE for these tests (examples/python/CMakeLists.txt).
EXIT_SKIP = 77

# Heartbeats fast enough for PROGRESS events to show within a short job (as local_cluster.h).
HEARTBEAT_INTERVAL = "100ms"
HEARTBEAT_TIMEOUT = "1s"

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_SERVING_LINE = re.compile(r"serving gRPC on ([^\s,;]+)")


def skip(message):
    """Exits with ctest's skip code, saying why."""
    print("SKIPPED: " + message, file=sys.stderr)
    sys.exit(EXIT_SKIP)


def parse_test_args(description):
    """Flags shared by the tests: --build_dir, --stubs, --grpc_python_plugin."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--build_dir", required=True,
                        help="CMake build folder with coordinator/ and worker/ binaries")
    parser.add_argument("--stubs", default="",
                        help="folder of the generated Python stubs (default BUILD_DIR/python)")
    parser.add_argument("--grpc_python_plugin", default="",
                        help="the gRPC Python protoc plugin the build used; a missing one "
                             "skips the test (exit 77)")
    args = parser.parse_args()
    args.stubs = args.stubs or os.path.join(args.build_dir, "python")
    return args


def require_api(args, *stub_files):
    """Skips (77) without python3-grpcio or the plugin; fails without the generated stubs.

    On success puts args.stubs on sys.path so `from cohort.v1 import jobs_pb2` works.
    """
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
    except ImportError as e:
        skip("python3-grpcio is not importable by {} ({}); apt-get install python3-grpcio"
             .format(sys.executable, e))
    if args.grpc_python_plugin and not os.access(args.grpc_python_plugin, os.X_OK):
        skip("no gRPC Python plugin ({}), so no stubs were generated; apt-get install "
             "protobuf-compiler-grpc and reconfigure".format(args.grpc_python_plugin))
    for stub_file in stub_files:
        if not os.path.isfile(os.path.join(args.stubs, stub_file)):
            print("FAILED: {} not found in {}: build the cohort-python-stubs target first"
                  .format(stub_file, args.stubs), file=sys.stderr)
            sys.exit(1)
    sys.path.insert(0, os.path.abspath(args.stubs))


def _die_with_parent():
    # Runs in the child between fork and exec: SIGKILL it when the test process dies, so a
    # test killed by ctest's timeout leaves no daemons behind. (preexec_fn is unsafe once
    # other threads exist: start the daemons before creating gRPC channels.)
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class LocalCluster:
    """Processes of one test cluster and the folder holding their logs and data."""

    def __init__(self, build_dir, name):
        self._build_dir = os.path.abspath(build_dir)
        self.dir = tempfile.mkdtemp(prefix="cohort-py-{}-".format(name))
        self._processes = []  # (name, Popen, log path)
        self.address = None
        self.failed = False

    def _start(self, name, argv):
        log_path = os.path.join(self.dir, name + ".log")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, cwd=self.dir,
                                       preexec_fn=_die_with_parent)
        self._processes.append((name, process, log_path))
        return process

    def _program(self, folder, name):
        """A program of the build; a sanitizer build's copy where $COHORT_TEST_PROGRAMS_DIR
        holds one (tools/sanitize.sh), as tests/testing/paths.h picks them."""
        programs = os.environ.get("COHORT_TEST_PROGRAMS_DIR")
        if programs:
            path = os.path.join(programs, folder, name)
            if os.access(path, os.X_OK):
                return path
        return os.path.join(self._build_dir, folder, name)

    def start_coordinator(self, timeout=30.0):
        """Starts the coordinator on a free loopback port; sets and returns self.address."""
        binary = self._program("coordinator", "cohort-coordinator")
        process = self._start("coordinator", [
            binary, "--listen=127.0.0.1:0", "--metrics_address=127.0.0.1:0",
            "--data_dir=" + os.path.join(self.dir, "data"),
            "--heartbeat_interval=" + HEARTBEAT_INTERVAL,
            "--heartbeat_timeout=" + HEARTBEAT_TIMEOUT])
        log_path = self._processes[-1][2]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(log_path, errors="replace") as log:
                match = _SERVING_LINE.search(log.read())
            if match:
                self.address = match.group(1)
                return self.address
            if process.poll() is not None:
                raise AssertionError("the coordinator exited with status {}:\n{}".format(
                    process.returncode, self.log("coordinator")))
            time.sleep(0.05)
        raise AssertionError("the coordinator logged no 'serving gRPC on' line within {:g} s:\n{}"
                             .format(timeout, self.log("coordinator")))

    def start_worker(self, worker_id, device_index):
        """Starts a CPU worker with one compute thread (the machine may have two cores)."""
        binary = self._program("worker", "cohort-worker")
        return self._start(worker_id, [
            binary, "--coordinator=" + self.address, "--worker_id=" + worker_id,
            "--host=pytest-host", "--device=cpu", "--device_index={}".format(device_index),
            "--metrics_address=127.0.0.1:0", "--threads=1"])

    def log(self, name):
        for process_name, _, log_path in self._processes:
            if process_name == name:
                with open(log_path, errors="replace") as log:
                    return log.read()
        return ""

    def close(self):
        """Kills every process by PID, waits for each (bounded), prints logs if a test failed."""
        for _, process, _ in self._processes:
            if process.poll() is None:
                process.kill()
        for name, process, _ in self._processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print("process {} (pid {}) did not exit after SIGKILL".format(name, process.pid),
                      file=sys.stderr)
        if self.failed:
            for name, _, _ in self._processes:
                print("----- {} log (last 3000 characters) -----\n{}".format(
                    name, self.log(name)[-3000:]), file=sys.stderr)
            print("logs kept in " + self.dir, file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class ClusterTestCase(unittest.TestCase):
    """A TestCase whose class holds a LocalCluster in `cluster`: a failed test
    marks it failed, so LocalCluster.close prints the processes' logs."""

    def run(self, result=None):
        result = super().run(result)
        if result is not None and not result.wasSuccessful():
            type(self).cluster.failed = True
        return result


def wait_for(what, timeout, predicate, interval=0.05):
    """Polls predicate() until it returns a true value (returned) or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after {:g} s waiting for {}".format(timeout, what))
        time.sleep(interval)


def exit_on_sigterm():
    """Turns SIGTERM into SystemExit so that finally blocks and cleanups still run."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
