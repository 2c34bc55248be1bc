#!/usr/bin/python3
"""Integration test of examples/python/submit_and_watch.py against a real cluster.

Starts a coordinator and two CPU workers from the build folder on loopback, runs the example
as a user would (a separate process, the same interpreter), and checks with its own gRPC client:

  - a tiny job submitted and watched by the example completes, the example exits 0 having
    printed progress lines, and a separate Jobs.Get shows COMPLETED at the requested step;
  - an invalid spec makes it exit 1 with the INVALID_ARGUMENT status;
  - a job longer than --timeout makes it exit 3 while the job keeps running (then cancelled);
  - an address nobody listens on makes it exit 2 within its --timeout.

  submit_and_watch_test.py --build_dir build/release [--stubs DIR] [--grpc_python_plugin PATH]

Exit status: 0 passed, 1 failed, 77 skipped (python3-grpcio or the gRPC Python plugin missing).
"""

import math
import os
import re
import socket
import subprocess
import sys
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import local_cluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "submit_and_watch.py")

STEPS = 1000     # about 1 s on two single-threaded workers: long enough for PROGRESS events
VOCAB_SIZE = 64  # the example's default model: 2 layers, width 32, context 32
EXAMPLE_TIMEOUT = 120.0  # seconds the example may take; the subprocess gets a little more

ARGS = None  # set in main()


def run_example(address, *flags, timeout=EXAMPLE_TIMEOUT):
    """Runs the example to its end; returns the CompletedProcess (text stdout and stderr)."""
    argv = [sys.executable, EXAMPLE, "--coordinator=" + address, "--stubs=" + ARGS.stubs,
            "--timeout={:g}".format(timeout)] + list(flags)
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout + 30)


def describe(result):
    return "exit {}\n--- stdout ---\n{}--- stderr ---\n{}".format(
        result.returncode, result.stdout, result.stderr)


def job_id_of(result):
    match = re.search(r"^submitted job (\S+) ", result.stdout, re.MULTILINE)
    return match.group(1) if match else None


class SubmitAndWatchTest(local_cluster.ClusterTestCase):

    @classmethod
    def setUpClass(cls):
        import grpc
        from cohort.v1 import jobs_pb2_grpc, workers_pb2, workers_pb2_grpc
        cls.cluster = local_cluster.LocalCluster(ARGS.build_dir, "submit-and-watch")
        # Runs even if the rest of setUpClass fails: every process is killed by PID.
        cls.addClassCleanup(cls.cluster.close)
        try:
            cls.cluster.start_coordinator()
            cls.cluster.start_worker("py-worker-0", 0)
            cls.cluster.start_worker("py-worker-1", 1)
            cls.channel = grpc.insecure_channel(cls.cluster.address)
            cls.addClassCleanup(cls.channel.close)
            grpc.channel_ready_future(cls.channel).result(timeout=30)
            cls.jobs = jobs_pb2_grpc.JobsStub(cls.channel)
            workers = workers_pb2_grpc.WorkersStub(cls.channel)

            def two_idle_workers():
                reply = workers.List(workers_pb2.ListWorkersRequest(), timeout=10)
                return sum(w.state == workers_pb2.WORKER_STATE_IDLE for w in reply.workers) >= 2

            local_cluster.wait_for("two idle workers", 30, two_idle_workers)
        except BaseException:
            cls.cluster.failed = True
            raise

    def get_job(self, job_id):
        from cohort.v1 import jobs_pb2
        return self.jobs.Get(jobs_pb2.GetJobRequest(job_id=job_id), timeout=10)

    def test_job_completes_at_the_requested_step(self):
        from cohort.v1 import job_pb2
        result = run_example(self.cluster.address, "--name=py-complete",
                             "--steps={}".format(STEPS), "--workers=2")
        self.assertEqual(result.returncode, 0, describe(result))
        job_id = job_id_of(result)
        self.assertIsNotNone(job_id, describe(result))
        lines = result.stdout.splitlines()
        self.assertTrue(any(line.startswith("SNAPSHOT ") for line in lines), describe(result))
        self.assertTrue(any(line.startswith("PROGRESS ") for line in lines), describe(result))
        self.assertIn("state COMPLETED", result.stdout, describe(result))
        self.assertIn("job {} completed at step {}".format(job_id, STEPS), result.stdout)

        job = self.get_job(job_id)
        self.assertEqual(job.state, job_pb2.JOB_STATE_COMPLETED, job.message)
        self.assertEqual(job.progress.step, STEPS)
        self.assertEqual(job.spec.steps, STEPS)
        self.assertEqual(job.mesh.data_parallel, 2)
        # It learned something: the loss starts near ln(vocab) = 4.16 and the source's floor
        # is ln(4) = 1.39.
        self.assertLess(job.progress.loss, math.log(VOCAB_SIZE) - 1.0)

    def test_invalid_spec_exits_1_with_the_status(self):
        # 3 does not divide the global batch of 8.
        result = run_example(self.cluster.address, "--name=py-invalid", "--micro_batch=3")
        self.assertEqual(result.returncode, 1, describe(result))
        self.assertIn("INVALID_ARGUMENT", result.stderr, describe(result))
        self.assertIn("batch.micro_batch_size", result.stderr, describe(result))
        self.assertIsNone(job_id_of(result), describe(result))

    def test_timeout_exits_3_and_leaves_the_job_running(self):
        from cohort.v1 import job_pb2, jobs_pb2
        start = time.monotonic()
        result = run_example(self.cluster.address, "--name=py-long", "--steps=10000000",
                             "--workers=2", timeout=3)
        elapsed = time.monotonic() - start
        job_id = job_id_of(result)
        try:
            self.assertEqual(result.returncode, 3, describe(result))
            self.assertIn("did not finish within 3 s", result.stderr, describe(result))
            self.assertLess(elapsed, 20, describe(result))
            self.assertIsNotNone(job_id, describe(result))
            job = self.get_job(job_id)
            self.assertIn(job.state, (job_pb2.JOB_STATE_PENDING, job_pb2.JOB_STATE_RUNNING),
                          job.message)
        finally:
            if job_id:
                self.jobs.Cancel(jobs_pb2.CancelJobRequest(job_id=job_id), timeout=10)
        job = self.get_job(job_id)
        self.assertEqual(job.state, job_pb2.JOB_STATE_CANCELLED)

    def test_unreachable_coordinator_exits_2(self):
        # A port that was free a moment ago; nothing listens on it.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            address = "127.0.0.1:{}".format(s.getsockname()[1])
        start = time.monotonic()
        result = run_example(address, timeout=2)
        self.assertEqual(result.returncode, 2, describe(result))
        self.assertIn("cannot reach the coordinator", result.stderr, describe(result))
        self.assertLess(time.monotonic() - start, 20)


def main():
    global ARGS
    local_cluster.exit_on_sigterm()
    ARGS = local_cluster.parse_test_args(__doc__.splitlines()[0])
    local_cluster.require_api(ARGS, os.path.join("cohort", "v1", "jobs_pb2_grpc.py"))
    program = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
