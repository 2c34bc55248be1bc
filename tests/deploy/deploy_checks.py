#!/usr/bin/env python3
"""Structural checks of the deploy/ tree that need no cluster and no network.

Usage: deploy_checks.py SOURCE_DIR SECTION...
Sections:
  kubernetes  every manifest has apiVersion, kind and metadata.name; the
              kustomizations render (a small built-in renderer for the
              subset of kustomize they use: resources, namespace, images,
              JSON 6902 patches); in each rendering containers have images,
              selectors match pod labels, Services and PodMonitors select
              pods and name ports those pods have, the coordinator keeps
              --data_dir on a volumeClaimTemplate, GPU workers request
              nvidia.com/gpu, flagfiles exist in the ConfigMap, and every
              daemon flag exists in coordinator/main.cc or worker/main.cc
  systemd     every flag in the units' ExecStart and the .env files exists
  metrics     every cohort_* name in the alert rules' and the Grafana
              dashboard's expressions is in docs/metrics.md's tables and in
              the code (a histogram's _bucket/_sum/_count series count as
              the histogram); a name in only one of the two is a warning;
              the dashboard is schemaVersion >= 36 with a
              Prometheus datasource variable
  container   the Containerfile's build packages are tools/dev's PACKAGES
              (less the documented test-only ones), two stages, the runtime
              one on an nvidia/cuda runtime image
Prints one line per finding and a summary; exit 0 when all pass, 1 when any
check fails, 77 when python3-yaml is missing (nothing checked).
"""

import copy
import glob
import json
import os
import re
import shlex
import sys

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed (apt-get install python3-yaml)")
    sys.exit(77)


class Checker:
    def __init__(self, root):
        self.root = root
        self.failures = []
        self.passed = 0

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def check(self, condition, message):
        if condition:
            self.passed += 1
        else:
            self.failures.append(message)
            print("FAIL: " + message)
        return condition


# --------------------------------------------------------------- daemon flags

# Flags every Abseil binary has besides its own.
ABSL_BUILTIN_FLAGS = {"flagfile", "fromenv", "tryfromenv", "undefok", "help", "helpfull",
                      "version", "only_check_args"}


def declared_flags(c, main_cc):
    with open(c.path(main_cc)) as f:
        return set(re.findall(r"ABSL_FLAG\(\s*[\w:<>]+\s*,\s*(\w+)\s*,", f.read())) | \
            ABSL_BUILTIN_FLAGS


def flag_names(words):
    """Names of --flag / --flag=value / -flag words."""
    names = []
    for word in words:
        m = re.match(r"^--?([A-Za-z_][A-Za-z0-9_]*)(=.*)?$", word)
        if m:
            names.append(m.group(1))
    return names


def check_flags(c, where, binary, words, flags):
    for name in flag_names(words):
        c.check(name in flags[binary], "{}: {} has no flag --{}".format(where, binary, name))


# --------------------------------------------------------------- kubernetes

def load_documents(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def json_pointer(document, pointer):
    """(parent, key) of an existing RFC 6901 pointer, or raises KeyError/IndexError."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.lstrip("/").split("/")]
    node = document
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = parts[-1]
    if isinstance(node, list):
        last = len(node) if last == "-" else int(last)
    elif last not in node:
        raise KeyError(pointer)
    return node, last


def apply_json6902(document, ops):
    for op in ops:
        kind = op["op"]
        if kind in ("replace", "remove"):
            parent, key = json_pointer(document, op["path"])
            if isinstance(parent, list) and not 0 <= key < len(parent):
                raise KeyError(op["path"])
            if kind == "remove":
                del parent[key]
            else:
                parent[key] = copy.deepcopy(op["value"])
        else:
            raise ValueError("unsupported patch op " + kind)


def render_kustomization(c, directory, seen=()):
    """Objects of a kustomization directory, or None after reporting why."""
    directory = os.path.normpath(directory)
    kfile = os.path.join(directory, "kustomization.yaml")
    rel = os.path.relpath(kfile, c.root)
    if not c.check(os.path.isfile(kfile), rel + " exists"):
        return None
    if not c.check(directory not in seen, rel + ": no cycle through " + directory):
        return None
    k = load_documents(kfile)[0]
    supported = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
    c.check(set(k) <= supported,
            "{}: fields {} are outside what this check renders".format(
                rel, sorted(set(k) - supported)))
    c.check(k.get("kind") == "Kustomization", rel + ": kind Kustomization")
    objects = []
    for resource in k.get("resources", []):
        target = os.path.join(directory, resource)
        if os.path.isdir(target):
            sub = render_kustomization(c, target, seen + (directory,))
            if sub is None:
                return None
            objects.extend(sub)
        elif c.check(os.path.isfile(target), "{}: resource {} exists".format(rel, resource)):
            objects.extend(load_documents(target))
        else:
            return None
    if "namespace" in k:
        for o in objects:
            if o.get("kind") != "Namespace":
                o.setdefault("metadata", {})["namespace"] = k["namespace"]
    for image in k.get("images", []):
        for o in objects:
            for container in pod_containers(o):
                name, _, tag = container.get("image", "").partition(":")
                if name == image["name"]:
                    container["image"] = "{}:{}".format(image.get("newName", name),
                                                        image.get("newTag", tag or "latest"))
    for patch in k.get("patches", []):
        target = patch.get("target", {})
        matched = [o for o in objects
                   if o.get("kind") == target.get("kind")
                   and o.get("metadata", {}).get("name") == target.get("name")]
        c.check(len(matched) == 1, "{}: patch target {} {} matches one object".format(
            rel, target.get("kind"), target.get("name")))
        ops = yaml.safe_load(patch["patch"])
        for o in matched:
            try:
                apply_json6902(o, ops)
            except (KeyError, IndexError, ValueError) as e:
                c.check(False, "{}: patch does not apply to {}: {}".format(rel, target.get("name"), e))
    return objects


def pod_spec(o):
    if o.get("kind") in ("StatefulSet", "Deployment", "DaemonSet", "Job"):
        return o.get("spec", {}).get("template", {}).get("spec", {})
    return None


def pod_labels(o):
    return o.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {}) or {}


def pod_containers(o):
    spec = pod_spec(o)
    if spec is None:
        return []
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_rendering(c, name, objects, flags, gpu):
    where = "kubernetes/" + name
    by_kind = {}
    for o in objects:
        for field in ("apiVersion", "kind"):
            c.check(bool(o.get(field)), "{}: an object without {}".format(where, field))
        c.check(bool(o.get("metadata", {}).get("name")),
                "{}: a {} without metadata.name".format(where, o.get("kind")))
        by_kind.setdefault(o.get("kind"), []).append(o)
    workloads = [o for o in objects if pod_spec(o) is not None]
    config_maps = {o["metadata"]["name"]: o for o in by_kind.get("ConfigMap", [])}
    services = {o["metadata"]["name"]: o for o in by_kind.get("Service", [])}

    for w in workloads:
        wname = "{} {}".format(w["kind"], w["metadata"]["name"])
        selector = w.get("spec", {}).get("selector", {}).get("matchLabels", {})
        c.check(selects(selector, pod_labels(w)),
                "{}: {} selector {} matches its pod labels".format(where, wname, selector))
        spec = pod_spec(w)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {t["metadata"]["name"]: t for t in w.get("spec", {}).get("volumeClaimTemplates", [])}
        if w["kind"] == "StatefulSet":
            service = w.get("spec", {}).get("serviceName")
            c.check(service in services,
                    "{}: {} serviceName {} is a Service here".format(where, wname, service))
        for cm in volumes.values():
            if "configMap" in cm:
                c.check(cm["configMap"].get("name") in config_maps,
                        "{}: {} mounts ConfigMap {} defined here".format(
                            where, wname, cm["configMap"].get("name")))
        for container in pod_containers(w):
            cname = "{} container {}".format(wname, container.get("name"))
            c.check(bool(container.get("image")), "{}: {} has an image".format(where, cname))
            for mount in container.get("volumeMounts", []):
                c.check(mount["name"] in volumes or mount["name"] in claims,
                        "{}: {} mounts volume {} that exists".format(where, cname, mount["name"]))
            command = list(container.get("command", [])) + list(container.get("args", []))
            binary = os.path.basename(command[0]) if command else ""
            if binary in flags:
                check_flags(c, "{}: {}".format(where, cname), binary, command[1:], flags)
                # Flagfiles must be keys of a ConfigMap mounted at their folder.
                for word in command[1:]:
                    if not word.startswith("--flagfile="):
                        continue
                    path = word.split("=", 1)[1]
                    found = None
                    for mount in container.get("volumeMounts", []):
                        if os.path.dirname(path) == mount["mountPath"].rstrip("/"):
                            volume = volumes.get(mount["name"], {})
                            cm = config_maps.get(volume.get("configMap", {}).get("name"))
                            if cm is not None:
                                found = cm["data"].get(os.path.basename(path))
                    if c.check(found is not None, "{}: {} flagfile {} is a mounted ConfigMap key".format(
                            where, cname, path)):
                        lines = [l.strip() for l in found.splitlines()]
                        lines = [l for l in lines if l and not l.startswith("#")]
                        check_flags(c, "{}: flagfile {}".format(where, path), binary, lines, flags)
                        command = command + lines
                # Files the daemon reads (TLS material, tokens) must be on a volume.
                mounts = [m["mountPath"].rstrip("/") + "/" for m in container.get("volumeMounts", [])]
                for word in command[1:]:
                    m = re.match(r"^--(tls_\w+|\w+_file)=(/.*)$", word)
                    if m:
                        c.check(any(m.group(2).startswith(p) for p in mounts),
                                "{}: {} --{}={} lies on a mounted volume".format(
                                    where, cname, m.group(1), m.group(2)))
            if binary == "cohort-coordinator":
                data_dir = [w_.split("=", 1)[1] for w_ in command if w_.startswith("--data_dir=")]
                mounted = [m for m in container.get("volumeMounts", [])
                           if m["name"] in claims and data_dir and m["mountPath"] == data_dir[0]]
                c.check(bool(mounted), "{}: {} keeps --data_dir on a volumeClaimTemplate".format(
                    where, cname))
                c.check(w["kind"] == "StatefulSet" and w["spec"].get("replicas", 1) == 1,
                        "{}: the coordinator is a StatefulSet of one replica".format(where))
                for claim in claims.values():
                    c.check("storage" in claim.get("spec", {}).get("resources", {}).get("requests", {}),
                            "{}: claim {} requests storage".format(where, claim["metadata"]["name"]))
            if binary == "cohort-worker":
                limits = container.get("resources", {}).get("limits", {})
                device = [w_.split("=", 1)[1] for w_ in command if w_.startswith("--device=")]
                if gpu:
                    c.check(str(limits.get("nvidia.com/gpu")) == "1",
                            "{}: {} limits nvidia.com/gpu to 1".format(where, cname))
                    c.check(device == ["gpu"], "{}: {} runs --device=gpu".format(where, cname))
                else:
                    c.check("nvidia.com/gpu" not in limits,
                            "{}: {} requests no GPU".format(where, cname))
                    c.check(device == ["cpu"], "{}: {} runs --device=cpu".format(where, cname))

    def ports_of(selector):
        pods = [w for w in workloads if selects(selector, pod_labels(w))]
        names = set()
        for w in pods:
            for container in pod_containers(w):
                for p in container.get("ports", []):
                    names.add(p.get("name"))
                    names.add(p.get("containerPort"))
        return pods, names

    for s in services.values():
        pods, ports = ports_of(s.get("spec", {}).get("selector", {}))
        c.check(bool(pods), "{}: Service {} selects pods".format(where, s["metadata"]["name"]))
        for p in s.get("spec", {}).get("ports", []):
            c.check(p.get("targetPort", p.get("port")) in ports,
                    "{}: Service {} targetPort {} is a container port".format(
                        where, s["metadata"]["name"], p.get("targetPort")))
    monitors = by_kind.get("PodMonitor", [])
    c.check(len(monitors) >= 1, where + ": a PodMonitor exists")
    jobs = set()
    for m in monitors:
        mname = m["metadata"]["name"]
        c.check(m.get("apiVersion") == "monitoring.coreos.com/v1",
                "{}: PodMonitor {} is monitoring.coreos.com/v1".format(where, mname))
        pods, ports = ports_of(m.get("spec", {}).get("selector", {}).get("matchLabels", {}))
        c.check(bool(pods), "{}: PodMonitor {} selects pods".format(where, mname))
        endpoints = m.get("spec", {}).get("podMetricsEndpoints", [])
        c.check(bool(endpoints), "{}: PodMonitor {} has endpoints".format(where, mname))
        for e in endpoints:
            c.check(e.get("port") in ports, "{}: PodMonitor {} port {} is a container port".format(
                where, mname, e.get("port")))
        job_label = m.get("spec", {}).get("jobLabel")
        for w in pods:
            jobs.add(pod_labels(w).get(job_label))
    c.check(jobs == {"cohort-coordinator", "cohort-worker"},
            "{}: PodMonitors label jobs cohort-coordinator and cohort-worker (got {})".format(
                where, sorted(str(j) for j in jobs)))


def section_kubernetes(c, flags):
    kdir = c.path("deploy", "kubernetes")
    for path in sorted(glob.glob(os.path.join(kdir, "**", "*.yaml"), recursive=True)):
        rel = os.path.relpath(path, c.root)
        try:
            docs = load_documents(path)
        except yaml.YAMLError as e:
            c.check(False, "{} parses: {}".format(rel, e))
            continue
        for d in docs:
            c.check(isinstance(d, dict) and d.get("apiVersion") and d.get("kind"),
                    "{}: every document has apiVersion and kind".format(rel))
            if d.get("kind") != "Kustomization":
                c.check(bool(d.get("metadata", {}).get("name")),
                        "{}: {} has metadata.name".format(rel, d.get("kind")))
    base = load_documents(os.path.join(kdir, "base", "kustomization.yaml"))[0]
    listed = set(base.get("resources", []))
    present = {os.path.basename(p) for p in glob.glob(os.path.join(kdir, "base", "*.yaml"))}
    c.check(present - {"kustomization.yaml"} == listed,
            "deploy/kubernetes/base/kustomization.yaml lists every manifest (unlisted: {})".format(
                sorted(present - {"kustomization.yaml"} - listed)))
    for name, gpu in (("", True), ("cpu-workers", False)):
        objects = render_kustomization(c, os.path.join(kdir, name))
        if objects is not None:
            check_rendering(c, name or "(gpu)", objects, flags, gpu)


# --------------------------------------------------------------- systemd

def section_systemd(c, flags):
    sdir = c.path("deploy", "systemd")
    units = {"cohort-coordinator.service": "cohort-coordinator",
             "cohort-worker@.service": "cohort-worker"}
    for unit, binary in units.items():
        with open(os.path.join(sdir, unit)) as f:
            text = f.read().replace("\\\n", " ")
        execs = re.findall(r"^ExecStart=(.*)$", text, re.M)
        c.check(len(execs) == 1, "{}: one ExecStart".format(unit))
        for line in execs:
            words = shlex.split(line)
            c.check(words and os.path.basename(words[0]) == binary,
                    "{}: ExecStart runs {}".format(unit, binary))
            check_flags(c, unit, binary, words[1:], flags)
        for key in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                    "PrivateTmp=yes", "StateDirectory=", "RestrictAddressFamilies=",
                    "EnvironmentFile=", "DynamicUser=yes"):
            c.check(re.search(r"^" + re.escape(key), text, re.M) is not None,
                    "{}: sets {}".format(unit, key))
        if binary == "cohort-worker":
            c.check(re.search(r"^DeviceAllow=char-nvidia", text, re.M) is not None,
                    "{}: allows the NVIDIA devices".format(unit))
            c.check("--device_index=%i" in text, "{}: the instance is the device index".format(unit))
    for env, binary in (("cohort-coordinator.env", "cohort-coordinator"),
                        ("cohort-worker.env", "cohort-worker")):
        with open(os.path.join(sdir, env)) as f:
            for line in f:
                m = re.match(r"^COHORT_FLAGS=(.*)$", line.strip())
                if m:
                    check_flags(c, env, binary, shlex.split(m.group(1)), flags)


# --------------------------------------------------------------- metrics

def documented_metrics(c):
    names = {}
    with open(c.path("docs", "metrics.md")) as f:
        for line in f:
            m = re.match(r"^\|\s*`(cohort_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|", line)
            if m:
                names[m.group(1)] = m.group(2)
    return names


def code_metrics(c):
    names = set()
    for folder in ("coordinator", "worker"):
        for path in glob.glob(c.path(folder, "**", "*.cc"), recursive=True):
            with open(path) as f:
                names.update(re.findall(r'"(cohort_[a-z0-9_]+)"', f.read()))
    return names


def base_name(name, documented):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            if documented.get(stem) == "histogram":
                return stem
    return name


def dashboard_expressions(dashboard):
    exprs = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if "expr" in t:
                    exprs.append(("panel '{}'".format(p.get("title")), t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    for v in dashboard.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if v.get("type") == "query" and q:
            exprs.append(("variable '{}'".format(v.get("name")), q))
    return exprs


def section_metrics(c):
    documented = documented_metrics(c)
    in_code = code_metrics(c)
    c.check(len(documented) >= 30, "docs/metrics.md tables list the metrics (found {})".format(
        len(documented)))
    # Not a failure here: the catalogue is docs/metrics.md's to keep; only
    # names the rules and the dashboard use must be in both.
    if set(documented) != in_code:
        print("WARNING: docs/metrics.md and the code differ (docs only: {}; code only: {})".format(
            sorted(set(documented) - in_code), sorted(in_code - set(documented))))
    exprs = []
    with open(c.path("deploy", "prometheus", "alerts.yml")) as f:
        for group in yaml.safe_load(f)["groups"]:
            for rule in group["rules"]:
                exprs.append(("alert " + rule.get("alert", rule.get("record", "?")), rule["expr"]))
    with open(c.path("deploy", "grafana", "cohort-dashboard.json")) as f:
        dashboard = json.load(f)
    exprs.extend(dashboard_expressions(dashboard))
    used = set()
    for where, expr in exprs:
        for name in re.findall(r"\bcohort_[a-z0-9_]+", expr):
            base = base_name(name, documented)
            used.add(base)
            c.check(base in documented, "{}: {} is not in docs/metrics.md".format(where, name))
            c.check(base in in_code, "{}: {} is not defined in coordinator/ or worker/".format(
                where, name))
    print("metrics: {} expressions use {} distinct metrics of {} documented".format(
        len(exprs), len(used), len(documented)))
    c.check(36 <= dashboard.get("schemaVersion", 0) <= 39,
            "dashboard schemaVersion is about 38 (got {})".format(dashboard.get("schemaVersion")))
    variables = dashboard.get("templating", {}).get("list", [])
    c.check(any(v.get("type") == "datasource" and v.get("query") == "prometheus" for v in variables),
            "dashboard has a Prometheus datasource variable")
    ids = []

    def walk(panels):
        for p in panels:
            ids.append(p.get("id"))
            if p.get("type") not in ("row", "text"):
                c.check(p.get("datasource", {}).get("uid") == "${datasource}",
                        "dashboard panel '{}' uses the datasource variable".format(p.get("title")))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    c.check(len(ids) == len(set(ids)), "dashboard panel ids are unique")
    rows = [p.get("title") for p in dashboard.get("panels", []) if p.get("type") == "row"]
    for row in ("Cluster", "Training (per worker)", "Recovery"):
        c.check(row in rows, "dashboard has a '{}' row".format(row))


# --------------------------------------------------------------- container

# Needed by the demo and the test suite only, not to build the binaries.
TEST_ONLY_PACKAGES = {"fortunes", "python3-torch", "openssl", "python3-grpcio", "python3-h2", "prometheus",
                      "python3-yaml", "yamllint", "shellcheck", "systemd", "iproute2"}


def section_container(c):
    with open(c.path("tools", "dev")) as f:
        dev = f.read()
    m = re.search(r"^PACKAGES=\((.*?)^\)", dev, re.M | re.S)
    if not c.check(m is not None, "tools/dev has a PACKAGES=( ... ) list"):
        return
    packages = set()
    for line in m.group(1).splitlines():
        packages.update(line.split("#", 1)[0].split())
    with open(c.path("deploy", "container", "Containerfile")) as f:
        text = f.read()
    froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    c.check(len(froms) == 2, "Containerfile has two stages (got {})".format(len(froms)))
    if len(froms) == 2:
        c.check(froms[0][0].endswith("debian:bookworm"), "the build stage is debian:bookworm")
        c.check(re.search(r"nvidia/cuda:.*runtime", froms[1][0]) is not None,
                "the runtime stage is an nvidia/cuda runtime image")
    joined = text.replace("\\\n", " ")
    first_install = re.search(r"apt-get install (.*?)(?:&&|$)", joined, re.M)
    installed = set()
    if c.check(first_install is not None, "the build stage installs packages"):
        installed = {w for w in first_install.group(1).split() if not w.startswith("-")}
    c.check(packages - TEST_ONLY_PACKAGES <= installed,
            "the build stage installs tools/dev's PACKAGES (missing: {})".format(
                sorted(packages - TEST_ONLY_PACKAGES - installed)))
    for binary in ("cohort-coordinator", "cohort-worker", "cohortctl"):
        c.check(binary in text, "the image carries " + binary)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 64
    c = Checker(os.path.abspath(argv[0]))
    flags = {"cohort-coordinator": declared_flags(c, "coordinator/main.cc"),
             "cohort-worker": declared_flags(c, "worker/main.cc")}
    sections = {"kubernetes": lambda: section_kubernetes(c, flags),
                "systemd": lambda: section_systemd(c, flags),
                "metrics": lambda: section_metrics(c),
                "container": lambda: section_container(c)}
    for name in argv[1:]:
        if name not in sections:
            print("unknown section " + name)
            return 64
        before = (c.passed, len(c.failures))
        sections[name]()
        print("{}: {} checks passed, {} failed".format(
            name, c.passed - before[0], len(c.failures) - before[1]))
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
