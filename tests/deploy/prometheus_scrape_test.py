#!/usr/bin/env python3
"""A real Prometheus scraping a real Cohort cluster on loopback.

Usage: prometheus_scrape_test.py BUILD_DIR [--keep]

Starts a coordinator and two CPU workers from BUILD_DIR, writes the file_sd
targets with deploy/prometheus/cohort-file-sd, and starts Debian's
`prometheus` with deploy/prometheus/prometheus.yml (scrape and evaluation
interval shortened to 1 s, refresh 1 s) and alerts.yml, on free loopback
ports with a temporary storage directory. It submits a small training job
and compares what Prometheus's HTTP API returns with what cohortctl reports:

  workers by state     sum by (state) (cohort_workers) == the idle/assigned
                       counts of `cohortctl workers` (exact; polled until
                       equal, since the gauges lag by a tick and a scrape)
  jobs by state        cohort_jobs{state="running"} == RUNNING jobs of
                       `cohortctl list`; after `cohortctl cancel`,
                       cohort_jobs{state="cancelled"} == 1
  step                 cohort_worker_step of each worker against the step of
                       `cohortctl get JOB` fetched at about the same time:
                       |ctl - prom| <= rate x (|t_ctl - t_sample| + 1 s) + 2,
                       rate being the job's measured steps per second,
                       t_sample the scrape's timestamp (timestamp()), 1 s
                       for the heartbeat refresh on both sides (500 ms each)
                       and 2 steps for the ranks' lockstep and rounding
  loss                 |cohort_worker_loss - ctl loss| <= 0.1 nats (compared
                       after step 100, on the loss plateau near 1.42 where
                       step-to-step noise is about 0.02)
  attach, generation   cohort_attach_streams == 2, sum(cohort_worker_attached)
                       == 2, cohort_worker_assignment_generation == the job's
                       generation
  rules                every rule of alerts.yml loaded with health "ok" and
                       none firing on a healthy cluster
  dashboard            every expression of deploy/grafana/cohort-dashboard.json
                       is valid PromQL against this server (Grafana's
                       variables substituted)

Every wait is bounded; ports are free ones on 127.0.0.1; every process it
starts is stopped by its pid in a finally block. Exit status: 0 pass, 1 fail,
77 skipped (no prometheus binary or no python3-yaml).
"""

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

try:
    import yaml
except ImportError:
    # Debian's python3-yaml serves /usr/bin/python3; another python3 first
    # on PATH (pyenv, a venv) may lack it.
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and \
            os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    print("SKIP: python3-yaml is not installed (apt-get install python3-yaml)")
    sys.exit(77)

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRAPE_INTERVAL_S = 1.0
HEARTBEAT_INTERVAL_S = 0.5
LOSS_TOLERANCE = 0.1


class TestFailure(Exception):
    pass


class CommandFailed(TestFailure):
    """A cohortctl call failed: retried while waiting."""


def log(message):
    print(message, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, timeout_s, predicate, interval_s=0.2):
    """Polls predicate() until it returns a truthy value; returns it."""
    deadline = time.monotonic() + timeout_s
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ValueError, KeyError, subprocess.SubprocessError, CommandFailed) as e:
            last_error = e
        time.sleep(interval_s)
    raise TestFailure("timed out after {} s waiting for {}{}".format(
        timeout_s, what, " (last error: {})".format(last_error) if last_error else ""))


class Processes:
    """Processes this test started, stopped by pid."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.started = []  # (name, Popen, log path)

    def start(self, name, args):
        path = os.path.join(self.log_dir, name + ".log")
        out = open(path, "w")
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
        out.close()
        self.started.append((name, process, path))
        log("started {} (pid {}): {}".format(name, process.pid, " ".join(args)))
        return process

    def check_alive(self):
        for name, process, path in self.started:
            if process.poll() is not None:
                raise TestFailure("{} (pid {}) exited with {}; log {}:\n{}".format(
                    name, process.pid, process.returncode, path, tail(path)))

    def stop_all(self):
        # Workers and Prometheus first, the coordinator last.
        for name, process, _ in reversed(self.started):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for name, process, _ in reversed(self.started):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
                log("{} (pid {}) did not stop in 10 s: killed".format(name, process.pid))
        log("stopped {} processes: {}".format(len(self.started), ", ".join(
            "{} {} (exit {})".format(n, p.pid, p.returncode) for n, p, _ in self.started)))

    def tails(self):
        for name, _, path in self.started:
            log("--- last lines of {} ---\n{}".format(name, tail(path)))


def tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


class Cohort:
    def __init__(self, build_dir, address):
        self.ctl = os.path.join(build_dir, "tools", "cohortctl")
        self.address = address

    def run(self, *args, check=True):
        command = [self.ctl, "--coordinator", self.address, "--output", "json"] + list(args)
        reply = subprocess.run(command, capture_output=True, text=True, timeout=30)
        if check and reply.returncode != 0:
            raise CommandFailed("{} exited {}: {}".format(" ".join(command), reply.returncode,
                                                        reply.stderr.strip()))
        return json.loads(reply.stdout) if reply.stdout.strip() else {}

    def workers(self):
        return self.run("workers").get("workers", [])

    def worker_counts(self):
        counts = {}
        for w in self.workers():
            state = w.get("state", "").replace("WORKER_STATE_", "").lower()
            counts[state] = counts.get(state, 0) + 1
        return counts

    def job(self, job_id):
        """(job, time.time() at the middle of the call)."""
        before = time.time()
        job = self.run("get", job_id)
        return job, (before + time.time()) / 2


class Prometheus:
    def __init__(self, address):
        self.base = "http://" + address

    def get(self, path, params=None):
        url = self.base + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.loads(reply.read().decode())

    def ready(self):
        try:
            with urllib.request.urlopen(self.base + "/-/ready", timeout=5) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def query(self, expr, show=True):
        """The instant vector of expr as [(labels, value)]."""
        reply = self.get("/api/v1/query", {"query": expr})
        if reply.get("status") != "success":
            raise TestFailure("query {} failed: {}".format(expr, reply))
        data = reply["data"]
        if data["resultType"] == "vector":
            result = [(r["metric"], float(r["value"][1])) for r in data["result"]]
        elif data["resultType"] == "scalar":
            result = [({}, float(data["result"][1]))]
        else:
            raise TestFailure("query {} returned a {}".format(expr, data["resultType"]))
        if show:
            log("  query {}\n    -> {}".format(expr, format_vector(result)))
        return result

    def scalar(self, expr, show=True):
        result = self.query(expr, show)
        if len(result) != 1:
            raise TestFailure("query {} returned {} series, wanted 1".format(expr, len(result)))
        return result[0][1]


def format_vector(result):
    if not result:
        return "(empty)"
    parts = []
    for labels, value in result:
        shown = {k: v for k, v in labels.items() if k != "__name__"}
        number = "{:.3f}".format(value) if abs(value) >= 1e6 else "{:g}".format(value)
        parts.append("{}{} = {}".format(labels.get("__name__", ""),
                                        json.dumps(shown, sort_keys=True), number))
    return "; ".join(parts)


def prometheus_config(source_dir, prom_dir):
    """prometheus.yml of deploy/ with 1 s intervals, next to alerts.yml."""
    with open(os.path.join(source_dir, "deploy", "prometheus", "prometheus.yml")) as f:
        config = yaml.safe_load(f)
    config["global"]["scrape_interval"] = "1s"
    config["global"]["scrape_timeout"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    jobs = [j["job_name"] for j in config["scrape_configs"]]
    if sorted(jobs) != ["cohort-coordinator", "cohort-worker"]:
        raise TestFailure("prometheus.yml scrape jobs are {}".format(jobs))
    for job in config["scrape_configs"]:
        for sd in job["file_sd_configs"]:
            sd["refresh_interval"] = "1s"
    for rules in config.get("rule_files", []):
        shutil.copy(os.path.join(source_dir, "deploy", "prometheus", rules),
                    os.path.join(prom_dir, rules))
    path = os.path.join(prom_dir, "prometheus.yml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path, config


def expect(condition, message):
    if not condition:
        raise TestFailure(message)
    log("  ok: " + message)


def compare_workers(cohort, prom):
    """Workers by state in Prometheus equal cohortctl workers (polled)."""
    last = {}

    def equal():
        ctl = cohort.worker_counts()
        series = {l.get("state"): v for l, v in
                  prom.query('sum by (state) (cohort_workers{job="cohort-coordinator"})', show=False)}
        last["ctl"], last["prom"] = ctl, series
        return all(series.get(s, -1) == ctl.get(s, 0) for s in ("idle", "assigned", "lost",
                                                               "draining"))

    try:
        wait_for("cohort_workers to match cohortctl workers", 15, equal, interval_s=0.5)
    finally:
        log("  query sum by (state) (cohort_workers{job=\"cohort-coordinator\"})\n    -> " +
            json.dumps(last.get("prom"), sort_keys=True))
        log("  cohortctl workers states -> " + json.dumps(last.get("ctl"), sort_keys=True))
    log("  ok: workers by state equal cohortctl workers (idle {}, assigned {})".format(
        last["ctl"].get("idle", 0), last["ctl"].get("assigned", 0)))
    return last["ctl"]


def run(build_dir, keep):
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        print("SKIP: no prometheus binary (apt-get install prometheus)")
        return 77
    binaries = {name: os.path.join(build_dir, path) for name, path in (
        ("coordinator", "coordinator/cohort-coordinator"), ("worker", "worker/cohort-worker"),
        ("cohortctl", "tools/cohortctl"))}
    for name, path in binaries.items():
        if not os.access(path, os.X_OK):
            raise TestFailure("{} not found at {} (build first)".format(name, path))

    work = tempfile.mkdtemp(prefix="cohort-prometheus-test.")
    processes = Processes(work)
    ok = False
    try:
        grpc_port, metrics_port, prom_port = free_port(), free_port(), free_port()
        coordinator = "127.0.0.1:{}".format(grpc_port)
        coordinator_metrics = "127.0.0.1:{}".format(metrics_port)
        cohort = Cohort(build_dir, coordinator)

        processes.start("coordinator", [
            binaries["coordinator"], "--listen", coordinator,
            "--metrics_address", coordinator_metrics,
            "--data_dir", os.path.join(work, "coordinator-data")])
        wait_for("the coordinator to answer", 30,
                 lambda: processes.check_alive() or cohort.run("list") is not None)
        for i in range(2):
            processes.start("worker-{}".format(i), [
                binaries["worker"], "--coordinator", coordinator,
                "--worker_id", "prom-w{}".format(i), "--host", "127.0.0.1", "--device", "cpu",
                "--device_index", str(i), "--threads", "1",
                "--metrics_address", "127.0.0.1:0"])

        def two_workers():
            processes.check_alive()
            w = cohort.workers()
            return len([x for x in w if x.get("state") == "WORKER_STATE_IDLE"
                        and x.get("metricsAddress")]) == 2
        wait_for("2 idle workers with metrics addresses", 30, two_workers)

        prom_dir = os.path.join(work, "prometheus")
        targets_dir = os.path.join(prom_dir, "cohort-targets")
        os.makedirs(targets_dir)
        subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "deploy", "prometheus",
                                                     "cohort-file-sd"),
                        "--output_dir", targets_dir, "--cohortctl", binaries["cohortctl"],
                        "--coordinator", coordinator, "--coordinator_metrics",
                        coordinator_metrics, "--label", "cluster=test"],
                       check=True, timeout=60)
        for name in sorted(os.listdir(targets_dir)):
            with open(os.path.join(targets_dir, name)) as f:
                log("file_sd {}: {}".format(name, json.dumps(json.load(f))))
        config_path, _ = prometheus_config(SOURCE_DIR, prom_dir)

        prom_address = "127.0.0.1:{}".format(prom_port)
        prom = Prometheus(prom_address)
        processes.start("prometheus", [
            prometheus_bin, "--config.file", config_path,
            "--storage.tsdb.path", os.path.join(prom_dir, "data"),
            "--web.listen-address", prom_address, "--log.level", "warn"])
        wait_for("Prometheus to be ready", 60,
                 lambda: processes.check_alive() or prom.ready(), interval_s=0.5)

        def targets_up():
            active = prom.get("/api/v1/targets")["data"]["activeTargets"]
            return len(active) == 3 and all(t["health"] == "up" for t in active) and active
        active = wait_for("3 targets up", 30, targets_up, interval_s=0.5)
        log("targets: " + "; ".join("{} {} {}".format(t["labels"]["job"], t["scrapeUrl"],
                                                      t["health"]) for t in active))

        log("== before the job")
        wait_for("the first scrapes", 15, lambda: prom.query(
            'cohort_workers{job="cohort-coordinator"}', show=False))
        counts = compare_workers(cohort, prom)
        expect(counts.get("idle") == 2, "both workers idle before the job")

        log("== a training job")
        reply = cohort.run("submit", os.path.join(SOURCE_DIR, "deploy", "local", "jobs", "demo.yaml"),
                           "--name", "promscrape", "--steps", "100000", "--width", "128",
                           "--layers", "4", "--min_workers", "2", "--max_workers", "2")
        job_id = reply["jobId"]
        log("submitted {}".format(job_id))

        def trained(min_step):
            processes.check_alive()
            job, _ = cohort.job(job_id)
            return (job.get("state") == "JOB_STATE_RUNNING" and job.get("readyWorkers") == 2
                    and int(job.get("progress", {}).get("step", 0)) >= min_step and job)
        first = wait_for("{} to reach step 100 on 2 workers".format(job_id), 120,
                         lambda: trained(100), interval_s=0.5)
        t_first = time.time()
        step_first = int(first["progress"]["step"])
        wait_for("Prometheus to scrape the running job", 15, lambda: prom.scalar(
            'cohort_jobs{job="cohort-coordinator", state="running"}', show=False) == 1)

        counts = compare_workers(cohort, prom)
        expect(counts.get("assigned") == 2, "both workers assigned while the job runs")
        listed = cohort.run("list").get("jobs", [])
        running = sum(1 for j in listed if j.get("state") == "JOB_STATE_RUNNING")
        prom_running = prom.scalar('cohort_jobs{job="cohort-coordinator", state="running"}')
        expect(prom_running == running == 1,
               "cohort_jobs{{state=\"running\"}} = {:g} = RUNNING jobs of cohortctl list ({})".format(
                   prom_running, running))
        jobs_by_state = prom.query('sum by (state) (cohort_jobs{job="cohort-coordinator"})')
        expect(len(jobs_by_state) == 6, "cohort_jobs has all 6 states")
        streams = prom.scalar('cohort_attach_streams{job="cohort-coordinator"}')
        expect(streams == 2, "cohort_attach_streams = 2")
        attached = prom.scalar('sum(cohort_worker_attached{job="cohort-worker"})')
        expect(attached == 2, "sum(cohort_worker_attached) = 2")

        time.sleep(3)  # a few more steps, to measure the step rate
        for round_ in range(3):
            log("== comparison round {}".format(round_ + 1))
            processes.check_alive()
            steps = prom.query('cohort_worker_step{job="cohort-worker"}')
            stamps = {l["worker_id"]: v for l, v in
                      prom.query('timestamp(cohort_worker_step{job="cohort-worker"})')}
            losses = prom.query('cohort_worker_loss{job="cohort-worker"}')
            generations = prom.query('cohort_worker_assignment_generation{job="cohort-worker"}')
            tokens = prom.query('cohort_worker_tokens_per_second{job="cohort-worker"}')
            job, t_ctl = cohort.job(job_id)
            ctl_step = int(job["progress"]["step"])
            ctl_loss = float(job["progress"]["loss"])
            rate = (ctl_step - step_first) / max(t_ctl - t_first, 1e-3)
            log("  cohortctl get {} --output json -> state {}, generation {}, step {}, loss {:.4f}"
                " (at {:.3f}); measured rate {:.1f} steps/s".format(
                    job_id, job["state"], job["generation"], ctl_step, ctl_loss, t_ctl, rate))
            expect(len(steps) == 2 and len(losses) == 2, "step and loss series for both workers")
            for labels, prom_step in steps:
                worker = labels["worker_id"]
                lag = abs(t_ctl - stamps[worker])
                tolerance = rate * (lag + 2 * HEARTBEAT_INTERVAL_S) + 2
                expect(prom_step > 0 and abs(ctl_step - prom_step) <= tolerance,
                       "{}: Prometheus step {:g} vs cohortctl {} (scraped {:.2f} s apart): "
                       "|difference| {:g} <= tolerance {:.1f}".format(
                           worker, prom_step, ctl_step, lag, abs(ctl_step - prom_step), tolerance))
            for labels, prom_loss in losses:
                expect(math.isfinite(prom_loss) and abs(prom_loss - ctl_loss) <= LOSS_TOLERANCE,
                       "{}: Prometheus loss {:.4f} vs cohortctl {:.4f}: within {}".format(
                           labels["worker_id"], prom_loss, ctl_loss, LOSS_TOLERANCE))
            for labels, generation in generations:
                expect(generation == int(job["generation"]),
                       "{}: assignment generation {:g} = job generation {}".format(
                           labels["worker_id"], generation, job["generation"]))
            for labels, value in tokens:
                expect(value > 0, "{}: tokens/s {:.0f} > 0".format(labels["worker_id"], value))
            # dp 2: every step all-reduces the gradients over the data group.
            comm_bytes = prom.query('sum by (worker_id) (cohort_worker_collective_bytes_total'
                                    '{job="cohort-worker", group="data"})')
            expect(len(comm_bytes) == 2 and all(v > 0 for _, v in comm_bytes),
                   "data-group collective bytes > 0 on both workers")
            time.sleep(2)

        log("== alert rules")
        groups = prom.get("/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        with open(os.path.join(SOURCE_DIR, "deploy", "prometheus", "alerts.yml")) as f:
            expected = [r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
        expect(sorted(r["name"] for r in rules) == sorted(expected),
               "all {} rules of alerts.yml are loaded".format(len(expected)))
        bad = ["{}: {} {}".format(r["name"], r["health"], r.get("lastError", "")) for r in rules
               if r["health"] != "ok"]
        expect(not bad, "every rule evaluates with health ok{}".format(
            "" if not bad else " (" + "; ".join(bad) + ")"))
        firing = [a["labels"]["alertname"] for a in prom.get("/api/v1/alerts")["data"]["alerts"]
                  if a["state"] == "firing"]
        expect(not firing, "no alert fires on a healthy cluster (firing: {})".format(firing))

        log("== dashboard expressions")
        with open(os.path.join(SOURCE_DIR, "deploy", "grafana", "cohort-dashboard.json")) as f:
            dashboard = json.load(f)
        exprs = []

        def walk(panels):
            for p in panels:
                exprs.extend((p.get("title"), t["expr"]) for t in p.get("targets", []) if "expr" in t)
                walk(p.get("panels", []))
        walk(dashboard["panels"])
        with_data = 0
        for title, expr in exprs:
            concrete = (expr.replace("$__rate_interval", "10s").replace("$__range", "2m")
                        .replace("$instance", ".*"))
            result = prom.query(concrete, show=False)
            with_data += bool(result)
            log("  {:<34} {:>3} series  {}".format(title[:34], len(result), concrete))
        log("  ok: all {} dashboard expressions are valid PromQL; {} return data here".format(
            len(exprs), with_data))

        log("== cancel")
        cohort.run("cancel", job_id)
        wait_for("cohort_jobs{state=\"cancelled\"} = 1", 15, lambda: prom.scalar(
            'cohort_jobs{job="cohort-coordinator", state="cancelled"}', show=False) == 1,
            interval_s=0.5)
        prom.query('cohort_jobs{job="cohort-coordinator", state=~"running|cancelled"}')
        log("  ok: the cancellation reached Prometheus")
        counts = compare_workers(cohort, prom)
        expect(counts.get("idle") == 2, "both workers idle again")
        ok = True
        log("PASS: Prometheus scraped the cluster and agrees with cohortctl")
        return 0
    except TestFailure as e:
        log("FAIL: {}".format(e))
        processes.tails()
        return 1
    finally:
        processes.stop_all()
        if ok and not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log("logs and data kept in " + work)


def main(argv):
    args = [a for a in argv if a != "--keep"]
    if len(args) != 1:
        print(__doc__)
        return 64
    return run(os.path.abspath(args[0]), keep="--keep" in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
