#!/usr/bin/python3
"""Submits a small training job to a Cohort coordinator and watches it to the end.

A client of the cohort.v1 API in Python, with Debian's python3-grpcio and stubs that the
build generates from proto/ into <build dir>/python/ (examples/python/README.md):

  1. builds a cohort.v1.JobSpec (a tiny GPT on the synthetic Markov source) from the flags,
  2. sends it with Jobs.Submit and prints the job id,
  3. follows the job with Jobs.Watch, one line per event (kind, step, loss, state,
     generation, ready workers), reconnecting when the coordinator is UNAVAILABLE (proto/README.md,
     "Retries": the first event of every Watch is a fresh snapshot),
  4. exits when the job reaches a terminal state, or when --timeout runs out.

Exit status: 0 the job COMPLETED; 1 the coordinator refused a request (the gRPC status is
printed) or the job ended FAILED or CANCELLED; 2 the coordinator cannot be reached; 3 --timeout
passed first (the job keeps running); 64 usage error; 77 python3-grpcio or the generated stubs
are missing.

  /usr/bin/python3 examples/python/submit_and_watch.py --coordinator 127.0.0.1:7070 --steps 50
"""

import argparse
import os
import sys
import time

EXIT_COMPLETED = 0
EXIT_FAILURE = 1
EXIT_UNREACHABLE = 2
EXIT_TIMEOUT = 3
EXIT_USAGE = 64
EXIT_MISSING_DEPENDENCY = 77

# Backoff between Watch reconnects while the coordinator is unavailable.
RECONNECT_INITIAL_SECONDS = 0.1
RECONNECT_MAX_SECONDS = 2.0
# The longest a single unary call (Submit, Get) may take.
UNARY_CALL_SECONDS = 30.0


class UsageError(Exception):
    pass


class ArgumentParser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error; here 2 means "unreachable", so raise instead."""

    def error(self, message):
        raise UsageError(message)


def default_stubs_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get(
        "COHORT_PYTHON_STUBS",
        os.path.join(here, "..", "..", "build", "release", "python"))


def parse_args(argv):
    parser = ArgumentParser(
        description="Submit a small Cohort job and watch it until it finishes.")
    parser.add_argument("--coordinator",
                        default=os.environ.get("COHORT_COORDINATOR", "localhost:7070"),
                        help="coordinator host:port (default $COHORT_COORDINATOR, else "
                             "localhost:7070)")
    parser.add_argument("--stubs", default=default_stubs_dir(),
                        help="folder of the generated cohort/v1/*_pb2*.py (default "
                             "$COHORT_PYTHON_STUBS, else build/release/python)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds for the whole run: connect, submit, watch (default 300)")
    parser.add_argument("--name", default="py-example", help="job name (JobSpec.name)")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    parser.add_argument("--workers", type=int, default=1,
                        help="elastic.min_workers (default 1)")
    parser.add_argument("--max_workers", type=int, default=0,
                        help="elastic.max_workers (default: --workers)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--vocab_size", type=int, default=64)
    parser.add_argument("--context_length", type=int, default=32)
    parser.add_argument("--global_batch", type=int, default=8,
                        help="batch.global_batch_size (default 8)")
    parser.add_argument("--micro_batch", type=int, default=4,
                        help="batch.micro_batch_size (default 4)")
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1,
                        help="seeds the weights, the Markov source and the sampler")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be > 0")
    return args


def import_api(stubs_dir):
    """Imports grpc and the generated modules; returns them or exits 77 saying what is missing."""
    try:
        import grpc  # noqa: F401
    except ImportError as e:
        print("submit_and_watch: python3-grpcio is not installed for {} ({}); on Debian: "
              "apt-get install python3-grpcio".format(sys.executable, e), file=sys.stderr)
        raise SystemExit(EXIT_MISSING_DEPENDENCY)
    if not os.path.isfile(os.path.join(stubs_dir, "cohort", "v1", "jobs_pb2_grpc.py")):
        print("submit_and_watch: no generated stubs in {} (build the cohort-python-stubs target, "
              "which needs protoc and grpc_python_plugin from protobuf-compiler-grpc, or pass "
              "--stubs)".format(stubs_dir), file=sys.stderr)
        raise SystemExit(EXIT_MISSING_DEPENDENCY)
    sys.path.insert(0, os.path.abspath(stubs_dir))
    from cohort.v1 import job_pb2, jobs_pb2, jobs_pb2_grpc
    return grpc, job_pb2, jobs_pb2, jobs_pb2_grpc


def build_spec(job_pb2, args):
    """The JobSpec of the flags: a tiny GPT learning an order-1 Markov source (entropy ln 4)."""
    spec = job_pb2.JobSpec(name=args.name, device_kind=job_pb2.DEVICE_KIND_CPU, steps=args.steps)
    spec.model.layers = args.layers
    spec.model.heads = args.heads
    spec.model.width = args.width
    spec.model.vocab_size = args.vocab_size
    spec.model.context_length = args.context_length
    spec.model.init_seed = args.seed
    spec.data.synthetic.seed = args.seed
    spec.data.synthetic.alphabet_size = min(16, args.vocab_size)
    spec.data.synthetic.branching = min(4, args.vocab_size)
    spec.data.synthetic.order = 1
    spec.data.synthetic.tokens = 100000
    spec.data.seed = args.seed
    spec.optimizer.learning_rate = args.learning_rate
    spec.optimizer.grad_clip = 1.0
    spec.batch.global_batch_size = args.global_batch
    spec.batch.micro_batch_size = args.micro_batch
    spec.elastic.min_workers = args.workers
    spec.elastic.max_workers = args.max_workers or args.workers
    return spec


def short_name(enum_type, value, prefix):
    name = enum_type.Name(value) if value in enum_type.values() else str(value)
    return name[len(prefix):] if name.startswith(prefix) else name


def status_text(error):
    """"CODE: details" of a grpc.RpcError."""
    return "{}: {}".format(error.code().name, error.details())


class Watcher:
    """Prints one line per Watch event that changes what a reader sees."""

    def __init__(self, job_pb2, jobs_pb2, steps):
        self._job_pb2 = job_pb2
        self._jobs_pb2 = jobs_pb2
        self._steps = steps
        self._last = None

    def report(self, event):
        job = event.job
        kind = short_name(self._jobs_pb2.JobEventKind, event.kind, "JOB_EVENT_KIND_")
        state = short_name(self._job_pb2.JobState, job.state, "JOB_STATE_")
        seen = (kind, state, job.generation, job.progress.step, job.ready_workers, job.message)
        if seen == self._last:
            return
        self._last = seen
        loss = "{:.4f}".format(job.progress.loss) if job.progress.step > 0 else "-"
        line = "{:<13} step {:>5}/{}  loss {:>7}  state {:<14} generation {}  ready {}/{}".format(
            kind, job.progress.step, self._steps, loss, state, job.generation,
            job.ready_workers, len(job.mesh.members))
        if job.message:
            line += "  ({})".format(job.message)
        print(line, flush=True)


def run(args):
    grpc, job_pb2, jobs_pb2, jobs_pb2_grpc = import_api(args.stubs)
    deadline = time.monotonic() + args.timeout

    def remaining():
        return deadline - time.monotonic()

    terminal = {job_pb2.JOB_STATE_COMPLETED, job_pb2.JOB_STATE_FAILED,
                job_pb2.JOB_STATE_CANCELLED}
    with grpc.insecure_channel(args.coordinator) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=remaining())
        except grpc.FutureTimeoutError:
            print("submit_and_watch: cannot reach the coordinator at {} within {:g} s".format(
                args.coordinator, args.timeout), file=sys.stderr)
            return EXIT_UNREACHABLE
        jobs = jobs_pb2_grpc.JobsStub(channel)

        request = jobs_pb2.SubmitJobRequest(spec=build_spec(job_pb2, args))
        try:
            # Submit is not idempotent (proto/README.md, "Retries"): one attempt only.
            job = jobs.Submit(request, timeout=min(UNARY_CALL_SECONDS, max(remaining(), 0.001)))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                print("submit_and_watch: Jobs.Submit: coordinator unreachable: " + status_text(e),
                      file=sys.stderr)
                return EXIT_UNREACHABLE
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                print("submit_and_watch: Jobs.Submit got no reply in time; the job may exist "
                      "(check with Jobs.List or cohortctl list before submitting again)",
                      file=sys.stderr)
                return EXIT_TIMEOUT
            print("submit_and_watch: Jobs.Submit refused: " + status_text(e), file=sys.stderr)
            return EXIT_FAILURE
        print("submitted job {} ({} steps)".format(job.job_id, args.steps), flush=True)

        watcher = Watcher(job_pb2, jobs_pb2, args.steps)
        backoff = RECONNECT_INITIAL_SECONDS
        final = None
        while final is None:
            if remaining() <= 0:
                break
            try:
                for event in jobs.Watch(jobs_pb2.WatchJobRequest(job_id=job.job_id),
                                        timeout=remaining()):
                    backoff = RECONNECT_INITIAL_SECONDS
                    watcher.report(event)
                    if event.job.state in terminal:
                        final = event.job
                # The stream ends OK after the terminal event; without one, watch again.
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    break
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    print("submit_and_watch: Jobs.Watch failed: " + status_text(e),
                          file=sys.stderr)
                    return EXIT_FAILURE
                print("coordinator unavailable ({}); watching again in {:.1f} s".format(
                    e.details(), backoff), flush=True)
                time.sleep(max(0.0, min(backoff, remaining())))
                backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)

        if final is None:
            print("submit_and_watch: job {} did not finish within {:g} s; it keeps running "
                  "(cancel it with: cohortctl cancel {})".format(
                      job.job_id, args.timeout, job.job_id), file=sys.stderr)
            return EXIT_TIMEOUT
        state = short_name(job_pb2.JobState, final.state, "JOB_STATE_")
        if final.state != job_pb2.JOB_STATE_COMPLETED:
            print("submit_and_watch: job {} ended {}: {}".format(
                final.job_id, state, final.message or "(no message)"), file=sys.stderr)
            return EXIT_FAILURE
        print("job {} completed at step {}, loss {:.4f}".format(
            final.job_id, final.progress.step, final.progress.loss), flush=True)
        return EXIT_COMPLETED


def main(argv):
    try:
        args = parse_args(argv)
    except UsageError as e:
        print("submit_and_watch: " + str(e), file=sys.stderr)
        return EXIT_USAGE
    try:
        return run(args)
    except KeyboardInterrupt:
        print("submit_and_watch: interrupted; the job keeps running", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
