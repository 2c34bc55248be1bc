#!/usr/bin/python3
"""Integration test of the coordinator's server reflection and health service, from Python.

Starts a real coordinator and talks to it as a generic gRPC tool would, without Cohort's
.proto files: over grpc.reflection.v1alpha.ServerReflection (stubs generated at build time from
examples/python/proto/reflection_v1alpha.proto) it

  - lists the services: exactly the services of proto/cohort/v1/*.proto, grpc.health.v1.Health
    and the reflection service itself;
  - fetches the file that defines cohort.v1.Jobs, parses it with descriptor_pb2, checks
    Submit and Watch, and checks it is the file the client stubs were generated from;
  - loads that file and its imports into a fresh descriptor pool (asking for missing imports
    by file name) and resolves cohort.v1.Jobs.Submit there; fetches a file by its name;
  - gets an error_response (NOT_FOUND) for an unknown symbol on the same stream;

and calls grpc.health.v1.Health/Check with hand-encoded bytes (status SERVING).

  reflection_test.py --build_dir build/release [--stubs DIR] [--grpc_python_plugin PATH]

Exit status: 0 passed, 1 failed, 77 skipped (python3-grpcio or the gRPC Python plugin missing).
"""

import glob
import importlib
import os
import queue
import sys
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import local_cluster  # noqa: E402

ARGS = None  # set in main()
CALL_TIMEOUT = 30  # seconds, every RPC
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"


def cohort_services():
    """Full names of the services in the generated cohort/v1 modules (from proto/)."""
    names = set()
    for path in glob.glob(os.path.join(ARGS.stubs, "cohort", "v1", "*_pb2.py")):
        module = importlib.import_module("cohort.v1." + os.path.basename(path)[:-3])
        names.update(s.full_name for s in module.DESCRIPTOR.services_by_name.values())
    return names


class ReflectionSession:
    """One ServerReflectionInfo stream: ask() sends a request and returns its response."""

    def __init__(self, channel):
        import reflection_v1alpha_pb2_grpc
        self._requests = queue.Queue()
        stub = reflection_v1alpha_pb2_grpc.ServerReflectionStub(channel)
        self._responses = stub.ServerReflectionInfo(iter(self._requests.get, None),
                                                    timeout=CALL_TIMEOUT)

    def ask(self, **fields):
        import reflection_v1alpha_pb2
        self._requests.put(reflection_v1alpha_pb2.ServerReflectionRequest(**fields))
        return next(self._responses)

    def close(self):
        self._requests.put(None)  # half-close; the server then ends the stream
        for _ in self._responses:
            pass


def file_descriptors(response):
    from google.protobuf import descriptor_pb2
    files = []
    for blob in response.file_descriptor_response.file_descriptor_proto:
        files.append(descriptor_pb2.FileDescriptorProto.FromString(blob))
    return files


class ReflectionTest(local_cluster.ClusterTestCase):

    @classmethod
    def setUpClass(cls):
        import grpc
        cls.cluster = local_cluster.LocalCluster(ARGS.build_dir, "reflection")
        cls.addClassCleanup(cls.cluster.close)  # kills the coordinator by PID, even on failure
        try:
            cls.cluster.start_coordinator()
            cls.channel = grpc.insecure_channel(cls.cluster.address)
            cls.addClassCleanup(cls.channel.close)
            grpc.channel_ready_future(cls.channel).result(timeout=CALL_TIMEOUT)
        except BaseException:
            cls.cluster.failed = True
            raise

    def setUp(self):
        self.session = ReflectionSession(self.channel)
        self.addCleanup(self.session.close)

    def test_lists_every_service(self):
        response = self.session.ask(list_services="")
        self.assertEqual(response.WhichOneof("message_response"), "list_services_response",
                         response)
        listed = [s.name for s in response.list_services_response.service]
        expected = cohort_services() | {HEALTH, REFLECTION}
        self.assertLessEqual(
            {"cohort.v1.Workers", "cohort.v1.Jobs", "cohort.v1.KeyValue", "cohort.v1.Checkpoints"},
            expected)
        self.assertEqual(sorted(listed), sorted(expected))
        self.assertEqual(len(listed), len(set(listed)), listed)

    def test_file_containing_jobs_has_submit(self):
        from cohort.v1 import jobs_pb2
        from google.protobuf import descriptor_pb2
        response = self.session.ask(file_containing_symbol="cohort.v1.Jobs")
        self.assertEqual(response.WhichOneof("message_response"), "file_descriptor_response",
                         response)
        self.assertEqual(response.original_request.file_containing_symbol, "cohort.v1.Jobs")
        files = {f.name: f for f in file_descriptors(response)}
        self.assertIn("cohort/v1/jobs.proto", files, sorted(files))
        jobs_file = files["cohort/v1/jobs.proto"]
        self.assertEqual(jobs_file.package, "cohort.v1")
        services = {s.name: s for s in jobs_file.service}
        self.assertIn("Jobs", services)
        methods = {m.name: m for m in services["Jobs"].method}
        self.assertIn("Submit", methods)
        self.assertEqual(methods["Submit"].input_type, ".cohort.v1.SubmitJobRequest")
        self.assertEqual(methods["Submit"].output_type, ".cohort.v1.Job")
        self.assertFalse(methods["Submit"].client_streaming or methods["Submit"].server_streaming)
        self.assertTrue(methods["Watch"].server_streaming)
        self.assertEqual(sorted(methods),
                         ["Cancel", "Delete", "Get", "GetLossHistory", "List", "Scale", "Submit",
                          "Watch"])
        # The server's file is the one the Python stubs were generated from.
        local = descriptor_pb2.FileDescriptorProto.FromString(jobs_pb2.DESCRIPTOR.serialized_pb)
        self.assertEqual(jobs_file, local)

    def test_descriptors_resolve_in_a_fresh_pool(self):
        from google.protobuf import descriptor_pool
        response = self.session.ask(file_containing_symbol="cohort.v1.Jobs.Submit")
        files = {f.name: f for f in file_descriptors(response)}
        # Imports the server did not send (it may send them all) are asked for by name.
        wanted = [d for f in files.values() for d in f.dependency]
        while wanted:
            name = wanted.pop()
            if name in files:
                continue
            more = self.session.ask(file_by_filename=name)
            self.assertEqual(more.WhichOneof("message_response"), "file_descriptor_response",
                             more)
            for f in file_descriptors(more):
                files.setdefault(f.name, f)
                wanted.extend(f.dependency)
        pool = descriptor_pool.DescriptorPool()
        added = set()

        def add(name):  # dependencies first
            if name in added:
                return
            for dependency in files[name].dependency:
                add(dependency)
            pool.Add(files[name])
            added.add(name)

        for name in files:
            add(name)
        submit = pool.FindMethodByName("cohort.v1.Jobs.Submit")
        self.assertEqual(submit.input_type.full_name, "cohort.v1.SubmitJobRequest")
        self.assertIn("spec", submit.input_type.fields_by_name)
        self.assertEqual(submit.input_type.fields_by_name["spec"].message_type.full_name,
                         "cohort.v1.JobSpec")
        self.assertIn("google/protobuf/timestamp.proto", files)

    def test_file_by_filename(self):
        response = self.session.ask(file_by_filename="cohort/v1/job.proto")
        self.assertEqual(response.WhichOneof("message_response"), "file_descriptor_response",
                         response)
        files = {f.name: f for f in file_descriptors(response)}
        self.assertIn("JobSpec", [m.name for m in files["cohort/v1/job.proto"].message_type])

    def test_unknown_symbol_is_an_error_response(self):
        import grpc
        response = self.session.ask(file_containing_symbol="cohort.v1.NoSuchService")
        self.assertEqual(response.WhichOneof("message_response"), "error_response", response)
        self.assertEqual(response.error_response.error_code, grpc.StatusCode.NOT_FOUND.value[0])
        # The stream goes on after an error.
        again = self.session.ask(list_services="")
        self.assertEqual(again.WhichOneof("message_response"), "list_services_response")

    def test_health_check_is_serving(self):
        # grpc.health.v1: HealthCheckRequest{service = 1} (empty: the whole server) and
        # HealthCheckResponse{status = 1}, SERVING = 1. Encoded by hand: Debian has no
        # Python health stubs, and gRPC C++'s built-in health service is not in the
        # server's reflection descriptor pool.
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check",
                                         request_serializer=None, response_deserializer=None)
        reply = check(b"", timeout=CALL_TIMEOUT)
        self.assertEqual(reply, b"\x08\x01")


def main():
    global ARGS
    local_cluster.exit_on_sigterm()
    ARGS = local_cluster.parse_test_args(__doc__.splitlines()[0])
    local_cluster.require_api(ARGS, "reflection_v1alpha_pb2_grpc.py",
                              os.path.join("cohort", "v1", "jobs_pb2.py"))
    program = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
