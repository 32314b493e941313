"""Checks of deploy/ against the real server, run by the *_test.sh scripts.

/usr/bin/python3 with Debian's python3-yaml (a yamllint dependency); no
third-party Kubernetes or Prometheus libraries: the manifests are rendered by
a small kustomize subset (compared with `kubectl kustomize` where kubectl
exists) and PromQL is scanned for metric names.

  deploy_checks.py metric-names SCRAPE RULES DASHBOARD ADAPTER HPA
  deploy_checks.py rules-sync RULES PROMETHEUSRULE
  deploy_checks.py prom-config PROMETHEUS_YML OUT TARGET RULES_DIR
  deploy_checks.py manifests HELPFULL K8S_DIR PODMONITOR SCRAPE_CONFIG OUT_DIR
  deploy_checks.py dockerfiles HELPFULL DOCKER_DIR K8S_DIR OUT_DIR
  deploy_checks.py render K8S_DIR OUT_DIR
  deploy_checks.py dashboard-exprs DASHBOARD RULES
  deploy_checks.py query-check PROM_URL RULES DASHBOARD SCRAPE
"""

import copy
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request

import yaml

HEALTH_SERVICE = "vaedecode.v1.VaeDecoder"

failures = []


def check(ok, message):
    if not ok:
        failures.append(message)
    return ok


def finish(what):
    if failures:
        for f in failures:
            print("FAIL:", f, file=sys.stderr)
        sys.exit(1)
    print("ok:", what)


def load_yaml_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


# ---------------------------------------------------------------- the server

def parse_helpfull(path):
    """{flag: default string} of the flags defined in server/main.cc."""
    text = open(path).read()
    section = re.search(r"Flags from server/main\.cc:\n(.*?)(?:\n\n|\Z)", text, re.S)
    if not section:
        raise SystemExit("FAIL: no 'Flags from server/main.cc' section in --helpfull output")
    flags = {}
    for entry in re.split(r"\n(?=    --)", section.group(1)):
        entry = " ".join(entry.split())
        m = re.match(r"--(\w+) \(.*\); default: (.*);$", entry)
        if m:
            default = m.group(2)
            if default.startswith('"') and default.endswith('"'):
                default = default[1:-1]
            flags[m.group(1)] = default
    if not flags:
        raise SystemExit("FAIL: parsed no flags from --helpfull")
    return flags


def parse_flags(lines):
    """[(name, value)] from --name=value tokens or flagfile lines."""
    out = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"--(\w+)(?:=(.*))?$", line)
        if not m:
            failures.append(f"not a --flag=value line: {line!r}")
            continue
        out.append((m.group(1), m.group(2) if m.group(2) is not None else "true"))
    return out


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def effective(flags, defaults):
    """The server's value of each flag: the defaults overridden in order."""
    values = dict(defaults)
    for name, value in flags:
        values[name] = value
    return values


# -------------------------------------------------------------------- PromQL

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
    "and", "or", "unless", "sum", "min", "max", "avg", "count", "stddev", "stdvar",
    "topk", "bottomk", "quantile", "count_values", "group", "inf", "nan", "le",
}


def metric_names(expr):
    """Metric names an expression selects (identifiers not called, not labels)."""
    # Drop label matchers, by/on lists and strings, then pick identifiers that
    # are not function calls or keywords.
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "{}", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", "[]", e)
    e = re.sub(r"\$\w+|\$\{[^}]*\}", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation
        if word.lower() in PROMQL_WORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def load_rules(path):
    rules = []
    for group in yaml.safe_load(open(path))["groups"]:
        rules.extend(group["rules"])
    return rules


def dashboard_exprs(path):
    dash = json.load(open(path))
    exprs = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                exprs.append((p["title"], t["expr"]))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        if v.get("type") == "query" and q:
            m = re.match(r"label_values\((.*),\s*\w+\)$", q)
            exprs.append((f"variable {v['name']}", m.group(1) if m else q))
    return dash, exprs


def scrape_samples(path):
    """{sample name: set of label names} of a /metrics text."""
    samples = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})?\s", line)
        if m:
            labels = set(re.findall(r'(\w+)="', m.group(3) or ""))
            samples.setdefault(m.group(1), set()).update(labels)
    return samples


def cmd_metric_names(scrape, rules_path, dashboard, adapter, hpa):
    samples = scrape_samples(scrape)
    check(any(n.startswith("vaedecode_") for n in samples), "the scrape has no vaedecode_ samples")
    rules = load_rules(rules_path)
    recorded = {r["record"] for r in rules if "record" in r}
    used = []  # (where, name)
    for r in rules:
        where = r.get("record") or r.get("alert")
        used += [(f"rule {where}", n) for n in metric_names(r["expr"])]
    _, exprs = dashboard_exprs(dashboard)
    used += [(f"dashboard '{t}'", n) for t, e in exprs for n in metric_names(e)]
    adapter_cfg = yaml.safe_load(load_yaml_docs(adapter)[0]["data"]["config.yaml"])
    for rule in adapter_cfg["rules"]:
        used += [("prometheus-adapter seriesQuery", n) for n in metric_names(rule["seriesQuery"])]
        exposed = rule["name"]["as"]
        for doc in load_yaml_docs(hpa):
            for m in doc["spec"]["metrics"]:
                if m["type"] == "Pods":
                    check(m["pods"]["metric"]["name"] == exposed,
                          f"HPA metric {m['pods']['metric']['name']} is not what the adapter serves ({exposed})")
    check(len(used) > 20, f"found only {len(used)} metric references: the PromQL scan is broken")
    checked = set()
    for where, name in used:
        if name == "up" or (where, name) in checked:
            continue
        checked.add((where, name))
        if ":" in name:
            check(name in recorded, f"{where}: {name} is not a recording rule")
        else:
            check(name in samples, f"{where}: {name} is not in the server's /metrics scrape")
    names = sorted({n for _, n in used if ":" not in n and n != "up"})
    print("raw metric names used (each checked against the scrape):", " ".join(names))
    finish("metric names")


def cmd_rules_sync(rules_path, prometheusrule):
    rules = yaml.safe_load(open(rules_path))
    doc = load_yaml_docs(prometheusrule)[0]
    check(doc["kind"] == "PrometheusRule", "prometheusrule.yaml is not a PrometheusRule")
    check(doc["spec"] == rules,
          "prometheusrule.yaml differs from rules/vaedecode.rules.yml: run deploy/prometheus/make_prometheusrule.sh")
    finish("PrometheusRule in sync")


def cmd_prom_config(src, out, target, rules_dir):
    """A loopback Prometheus config derived from deploy/prometheus/prometheus.yml:
    the pod discovery becomes one static target carrying the __meta labels the
    real relabelling reads (Debian's Prometheus has no Kubernetes discovery)."""
    cfg = yaml.safe_load(open(src))
    jobs = [j for j in cfg["scrape_configs"] if j["job_name"] == "vaedecode"]
    check(len(jobs) == 1, "prometheus.yml has no vaedecode job")
    job = jobs[0]
    check("kubernetes_sd_configs" in job, "the vaedecode job does not discover pods")
    job.pop("kubernetes_sd_configs", None)
    job["static_configs"] = [{"targets": [target], "labels": {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "vaedecode",
        "__meta_kubernetes_pod_container_port_name": "metrics",
        "__meta_kubernetes_namespace": "e2e",
        "__meta_kubernetes_pod_name": "vaedecode-e2e-0",
        "__meta_kubernetes_pod_node_name": "loopback",
    }}]
    # A second target that the relabelling must drop (another app's port).
    job["static_configs"].append({"targets": ["127.0.0.1:1"], "labels": {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "other",
        "__meta_kubernetes_pod_container_port_name": "metrics",
    }})
    cfg["global"]["scrape_interval"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    cfg["rule_files"] = [os.path.join(rules_dir, os.path.basename(r)) for r in cfg["rule_files"]]
    with open(out, "w") as f:
        yaml.safe_dump(cfg, f)
    finish("prometheus config")


# ---------------------------------------------------------------- kustomize

def strategic_merge(base, patch):
    """Strategic merge patch, the subset our overlays use: maps merge, lists
    of maps merge by "name" (containerPort for ports), other lists replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and patch and all(isinstance(x, dict) for x in patch):
        key = next((k for k in ("name", "containerPort") if all(k in x for x in patch + base)), None)
        if key:
            # Like kustomize: items new to the list come first, in patch order.
            out = [copy.deepcopy(x) for x in base]
            added = []
            for item in patch:
                for i, b in enumerate(out):
                    if b[key] == item[key]:
                        out[i] = strategic_merge(b, item)
                        break
                else:
                    added.append(copy.deepcopy(item))
            return added + out
    return copy.deepcopy(patch)


def kustomize(folder):
    kfile = os.path.join(folder, "kustomization.yaml")
    k = yaml.safe_load(open(kfile))
    allowed = {"apiVersion", "kind", "namespace", "resources", "images", "patches"}
    check(set(k) <= allowed, f"{kfile}: fields {set(k) - allowed} need the real kustomize")
    objects = []
    for r in k.get("resources", []):
        path = os.path.normpath(os.path.join(folder, r))
        objects += kustomize(path) if os.path.isdir(path) else load_yaml_docs(path)
    for p in k.get("patches", []):
        for patch in load_yaml_docs(os.path.join(folder, p["path"])):
            targets = [o for o in objects if o["kind"] == patch["kind"]
                       and o["metadata"]["name"] == patch["metadata"]["name"]]
            check(len(targets) == 1, f"{folder}: patch {p['path']} matches {len(targets)} objects")
            for t in targets:
                objects[objects.index(t)] = strategic_merge(t, patch)
    for img in k.get("images", []):
        for o in objects:
            for c in pod_spec(o).get("containers", []) if pod_spec(o) else []:
                name, _, tag = c["image"].partition(":")
                if name == img["name"]:
                    c["image"] = img.get("newName", name) + ":" + img.get("newTag", tag or "latest")
    if "namespace" in k:
        for o in objects:
            if o["kind"] != "Namespace":
                o["metadata"]["namespace"] = k["namespace"]
    return objects


def pod_spec(obj):
    if obj.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return obj["spec"]["template"]["spec"]
    return None


def index(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


# ---------------------------------------------------------------- manifests

def quantity(text):
    """Bytes of a Kubernetes memory quantity (8Gi, 512Mi, 1G, 1000)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTP]i?)?", str(text))
    if not m:
        raise ValueError(f"quantity {text!r}")
    scale = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}[m.group(2)]
    return float(m.group(1)) * scale


def probe_window(probe):
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


def check_overlay(name, objects, defaults, podmonitor, scrape_cfg, out_dir):
    objs = index(objects)
    where = f"overlay {name}"
    dep = objs.get(("Deployment", "vaedecode"))
    cm = objs.get(("ConfigMap", "vaedecode-flags"))
    if not check(dep is not None and cm is not None, f"{where}: no Deployment/ConfigMap vaedecode"):
        return
    spec = pod_spec(dep)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    check(dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items(),
          f"{where}: the Deployment's selector does not select its pods")
    (c,) = [c for c in spec["containers"] if c["name"] == "server"]

    # Flags: the ConfigMap's flagfile, passed by --flagfile, known to the server.
    flagfile_text = cm["data"]["server.flags"]
    with open(os.path.join(out_dir, f"{name}.flags"), "w") as f:
        f.write(flagfile_text)
    args = parse_flags(c.get("args", []))
    flagfiles = [v for k, v in args if k == "flagfile"]
    check(len(flagfiles) == 1, f"{where}: the container does not pass one --flagfile")
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    if flagfiles:
        d, base = os.path.split(flagfiles[0])
        cm_mounts = [m for m in mounts.values() if m["mountPath"] == d
                     and volumes.get(m["name"], {}).get("configMap", {}).get("name") == "vaedecode-flags"]
        check(len(cm_mounts) == 1 and base in cm["data"],
              f"{where}: --flagfile={flagfiles[0]} is not the mounted ConfigMap key")
    flags = parse_flags(flagfile_text.splitlines())
    for k, _ in flags + args:
        check(k in defaults or k == "flagfile", f"{where}: --{k} is not a vaedecode_server flag")
    values = effective(flags + [a for a in args if a[0] != "flagfile"], defaults)

    # Ports: container ports = --listen / --metrics_listen; probes on gRPC.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports.get("grpc") == port_of(values["listen"]),
          f"{where}: containerPort grpc {ports.get('grpc')} != --listen {values['listen']}")
    check(ports.get("metrics") == port_of(values["metrics_listen"]),
          f"{where}: containerPort metrics {ports.get('metrics')} != --metrics_listen {values['metrics_listen']}")
    if values.get("http_listen"):
        check(ports.get("http") == port_of(values["http_listen"]),
              f"{where}: containerPort http {ports.get('http')} != --http_listen {values['http_listen']}")
    else:
        check("http" not in ports, f"{where}: containerPort http without --http_listen")
    probes = {}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(kind)
        if not check(p is not None and "grpc" in p, f"{where}: no native gRPC {kind}"):
            continue
        check(p["grpc"]["port"] == ports.get("grpc"), f"{where}: {kind} port is not the gRPC port")
        service = p["grpc"].get("service", "")
        check(service in ("", HEALTH_SERVICE) or service.startswith(HEALTH_SERVICE + "/"),
              f"{where}: {kind} service {service!r} is not a vaedecode health name")
        probes[kind] = p
    with open(os.path.join(out_dir, f"{name}.probes"), "w") as f:
        for p in probes.values():
            f.write(p["grpc"].get("service", "") + "\n")

    # Timing: startup and liveness outlast a group (re)start; the grace
    # period covers the preStop pause and the drain.
    start_timeout = int(values["worker_start_timeout_s"])
    if "startupProbe" in probes:
        check(probe_window(probes["startupProbe"]) >= start_timeout,
              f"{where}: startupProbe allows {probe_window(probes['startupProbe'])} s < --worker_start_timeout_s={start_timeout}")
    if "livenessProbe" in probes:
        check(probe_window(probes["livenessProbe"]) >= start_timeout,
              f"{where}: livenessProbe would restart a pod during a group rebuild "
              f"({probe_window(probes['livenessProbe'])} s < {start_timeout} s)")
    pre = c.get("lifecycle", {}).get("preStop", {})
    pause = 0
    if "exec" in pre:
        cmd = pre["exec"]["command"]
        check(os.path.basename(cmd[0]) == "sleep" and len(cmd) == 2, f"{where}: preStop is not a sleep")
        pause = int(cmd[-1])
    elif "sleep" in pre:
        pause = int(pre["sleep"]["seconds"])
    check(pause > 0, f"{where}: no preStop pause")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    drain = int(values["drain_timeout_s"])
    check(grace >= pause + drain + 5,
          f"{where}: terminationGracePeriodSeconds {grace} < preStop {pause} + --drain_timeout_s={drain} + 5")

    # Model repository: mounted read-only where --model_repository points.
    repo = values["model_repository"]
    if repo:
        m = [m for m in mounts.values() if m["mountPath"] == repo]
        check(len(m) == 1 and m[0].get("readOnly") is True, f"{where}: --model_repository={repo} is not a read-only mount")
        if m:
            v = volumes.get(m[0]["name"], {})
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            check(claim is None or ("PersistentVolumeClaim", claim) in objs,
                  f"{where}: PVC {claim} is not in the overlay")

    # Devices and resources.
    devices = values["devices"]
    group = int(values["group_size"])
    res = c.get("resources", {})
    req, lim = res.get("requests", {}), res.get("limits", {})
    check(req and lim and "memory" in lim and "cpu" in req, f"{where}: requests/limits incomplete")
    threads = int(values["threads"])
    if devices.startswith("cuda:"):
        n = len(devices[5:].split(","))
        check(str(lim.get("nvidia.com/gpu")) == str(n) and str(req.get("nvidia.com/gpu", n)) == str(n),
              f"{where}: nvidia.com/gpu {lim.get('nvidia.com/gpu')} != {n} devices in --devices={devices}")
        check(bool(spec.get("nodeSelector")), f"{where}: GPU pods need a nodeSelector")
        check(any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])),
              f"{where}: GPU pods need the nvidia.com/gpu toleration")
        shm = [m for m in mounts.values() if m["mountPath"] == "/dev/shm"]
        check(len(shm) == 1 and volumes.get(shm[0]["name"], {}).get("emptyDir", {}).get("medium") == "Memory",
              f"{where}: NCCL needs a memory-backed /dev/shm")
        check(values["dtype"] in ("float32", "bfloat16", "float16"), f"{where}: --dtype={values['dtype']}")
    else:
        n = int(devices.split(":")[1])
        check("nvidia.com/gpu" not in lim, f"{where}: CPU pods request GPUs")
        check(values["dtype"] != "float16", f"{where}: float16 does not run on CPU")
        check(float(req["cpu"]) >= n * threads, f"{where}: cpu request {req['cpu']} < {n} ranks x {threads} threads")
        budget = int(values.get("memory_budget_mib", "0")) << 20
        check(n * budget < quantity(lim["memory"]),
              f"{where}: {n} ranks x --memory_budget_mib exceed the memory limit {lim['memory']}")
    check(n % group == 0, f"{where}: {n} devices do not split into groups of {group}")

    # Services, PDB, HPA select the pods and use the container's ports.
    for svc_name, headless in (("vaedecode", False), ("vaedecode-headless", True)):
        svc = objs.get(("Service", svc_name))
        if not check(svc is not None, f"{where}: no Service {svc_name}"):
            continue
        check(svc["spec"]["selector"].items() <= pod_labels.items(), f"{where}: Service {svc_name} selects no pod")
        check((svc["spec"].get("clusterIP") == "None") == headless,
              f"{where}: Service {svc_name} clusterIP {svc['spec'].get('clusterIP')}")
        check(svc["spec"].get("type", "ClusterIP") == "ClusterIP", f"{where}: Service {svc_name} is not ClusterIP")
        for p in svc["spec"]["ports"]:
            check(p["targetPort"] in ports or p["targetPort"] in ports.values(),
                  f"{where}: Service {svc_name} targets unknown port {p['targetPort']}")
        check(any(p["targetPort"] in ("grpc", ports.get("grpc")) for p in svc["spec"]["ports"]),
              f"{where}: Service {svc_name} does not expose gRPC")
    pdb = objs.get(("PodDisruptionBudget", "vaedecode"))
    if check(pdb is not None, f"{where}: no PodDisruptionBudget"):
        check(pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items(), f"{where}: the PDB selects no pod")
    hpa = objs.get(("HorizontalPodAutoscaler", "vaedecode"))
    if check(hpa is not None, f"{where}: no HorizontalPodAutoscaler"):
        check(hpa["spec"]["scaleTargetRef"]["name"] == "vaedecode", f"{where}: the HPA scales something else")
        check("replicas" not in dep["spec"], f"{where}: the Deployment sets replicas the HPA owns")
        check(any(m["type"] == "Pods" for m in hpa["spec"]["metrics"]), f"{where}: the HPA uses no custom pod metric")

    # Prometheus finds the metrics port by name.
    pm = podmonitor["spec"]
    check(pm["selector"]["matchLabels"].items() <= pod_labels.items(), "PodMonitor selects no vaedecode pod")
    check(all(e["port"] in ports for e in pm["podMetricsEndpoints"]), "PodMonitor scrapes a port the pod does not name")
    check(pm.get("jobLabel") in pod_labels and pod_labels[pm["jobLabel"]] == "vaedecode",
          "PodMonitor's job label would not be \"vaedecode\" (the alerts' up{job=\"vaedecode\"})")
    keeps = {tuple(r["source_labels"]): r["regex"] for r in scrape_cfg["relabel_configs"] if r.get("action") == "keep"}
    check(keeps.get(("__meta_kubernetes_pod_container_port_name",)) in ports,
          "prometheus.yml keeps a port name the pod does not have")
    check(keeps.get(("__meta_kubernetes_pod_label_app_kubernetes_io_name",)) == pod_labels.get("app.kubernetes.io/name"),
          "prometheus.yml keeps another app")

    # Security: the image's non-root user.
    sc = spec.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) > 0, f"{where}: pods may run as root")
    with open(os.path.join(out_dir, f"{name}.uid"), "w") as f:
        f.write(str(sc.get("runAsUser")))


def cmd_manifests(helpfull, k8s_dir, podmonitor_path, scrape_path, out_dir):
    defaults = parse_helpfull(helpfull)
    podmonitor = load_yaml_docs(podmonitor_path)[0]
    scrape_cfg = [j for j in yaml.safe_load(open(scrape_path))["scrape_configs"] if j["job_name"] == "vaedecode"][0]
    kubectl = shutil.which("kubectl")
    overlays = sorted(os.listdir(os.path.join(k8s_dir, "overlays")))
    check(overlays == ["cpu", "gpu"], f"overlays: {overlays}")
    for name in overlays:
        folder = os.path.join(k8s_dir, "overlays", name)
        objects = kustomize(folder)
        kinds = sorted(o["kind"] for o in objects)
        print(f"overlay {name}: {len(objects)} objects: {' '.join(kinds)}")
        if kubectl:
            # The real kustomize must render the same objects.
            r = subprocess.run([kubectl, "kustomize", folder], capture_output=True, text=True)
            if check(r.returncode == 0, f"kubectl kustomize {folder}: {r.stderr.strip()}"):
                real = index(yaml.safe_load_all(r.stdout))
                mine = index(objects)
                check(sorted(real) == sorted(mine), f"overlay {name}: kubectl renders {sorted(real)}")
                for key in real:
                    check(real[key] == mine.get(key), f"overlay {name}: {key} differs from kubectl kustomize's")
                print(f"overlay {name}: identical to `kubectl kustomize`")
        else:
            print("kubectl not installed: rendered with the built-in kustomize subset only")
        check_overlay(name, objects, defaults, podmonitor, scrape_cfg, out_dir)
    finish("manifests")


def cmd_render(k8s_dir, out_dir):
    """Each overlay rendered (OUT_DIR/NAME.yaml, for the schema validator) and
    its server container's image (OUT_DIR/NAME.image, what the image checks
    build and run)."""
    for name in sorted(os.listdir(os.path.join(k8s_dir, "overlays"))):
        objects = kustomize(os.path.join(k8s_dir, "overlays", name))
        with open(os.path.join(out_dir, f"{name}.yaml"), "w") as f:
            yaml.safe_dump_all(objects, f, sort_keys=False)
        dep = index(objects).get(("Deployment", "vaedecode"))
        images = [c["image"] for c in pod_spec(dep)["containers"] if c["name"] == "server"] if dep else []
        if check(len(images) == 1, f"overlay {name}: no server container"):
            with open(os.path.join(out_dir, f"{name}.image"), "w") as f:
                f.write(images[0] + "\n")
            print(f"overlay {name}: {len(objects)} objects, image {images[0]}")
    finish("rendered")


# ----------------------------------------------------------------- Dockerfiles

def parse_dockerfile(path):
    """[(instruction, argument text)] with continuation lines joined."""
    lines, cur = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if cur and line.lstrip().startswith("#"):
            continue
        cur += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            ins, _, rest = cur.strip().partition(" ")
            lines.append((ins.upper(), rest.strip()))
            cur = ""
    return lines


def exec_form(text):
    check(text.lstrip().startswith("["), f"not exec form: {text}")
    return json.loads(text)


def cmd_dockerfiles(helpfull, docker_dir, k8s_dir, out_dir):
    defaults = parse_helpfull(helpfull)
    uid = open(os.path.join(out_dir, "uid")).read().strip() if os.path.exists(os.path.join(out_dir, "uid")) else None
    for flavour in ("cpu", "gpu"):
        path = os.path.join(docker_dir, f"Dockerfile.{flavour}")
        where = os.path.basename(path)
        ins = parse_dockerfile(path)
        froms = [a for i, a in ins if i == "FROM"]
        check(len(froms) >= 2, f"{where}: not multi-stage")
        final = max(k for k, (i, _) in enumerate(ins) if i == "FROM")
        tail = ins[final:]
        get = lambda name: [a for i, a in tail if i == name]
        if flavour == "cpu":
            check(all("DEBIAN_IMAGE" in f or "debian:12" in f for f in froms), f"{where}: not Debian 12")
            check(any("tools/setup.sh" in a for i, a in ins if i == "RUN"), f"{where}: does not install the README's packages")
            check(re.search(r"ARG DEBIAN_IMAGE=debian:12\b", open(path).read()) is not None, f"{where}: base is not debian:12")
        else:
            # Debian 12 like the CPU image: NVIDIA's libraries come from the
            # PyPI wheels torch pins, not from a CUDA base image.
            check(all("DEBIAN_IMAGE" in f for f in froms), f"{where}: a stage is not on Debian 12 (DEBIAN_IMAGE)")
            check(any("tools/nvidia_wheels.sh" in a for i, a in ins if i == "RUN"),
                  f"{where}: does not take NVIDIA's libraries from the pinned wheels")
            check(any("--config=gpu" in a for i, a in ins if i == "RUN"), f"{where}: does not build the GPU worker path (--config=gpu)")
            check(any("tools/setup.sh" in a for i, a in ins if i == "RUN"),
                  f"{where}: does not install the README's packages and LibTorch")
            text = open(path).read()
            for arg in re.findall(r"^ARG (\w+)", text, re.M):
                check(re.search(rf"^#\s+{arg}\s", text, re.M) is not None, f"{where}: build arg {arg} is not documented")
        user = get("USER")
        check(len(user) == 1 and user[0].split(":")[0] not in ("0", "root"), f"{where}: final stage runs as root")
        if user:
            check(uid is None or user[0].split(":")[0] == uid,
                  f"{where}: USER {user[0]} is not the Deployment's runAsUser {uid}")
            check(re.search(rf"--uid {user[0].split(':')[0]}\b", open(path).read()) is not None,
                  f"{where}: user {user[0]} is not created")
        (entry,) = get("ENTRYPOINT") or [None]
        (cmd,) = get("CMD") or [None]
        (health,) = get("HEALTHCHECK") or [None]
        if not check(entry and cmd and health, f"{where}: needs ENTRYPOINT, CMD and HEALTHCHECK"):
            continue
        entry, cmd = exec_form(entry), exec_form(cmd)
        check(entry[0].endswith("/server/vaedecode_server"), f"{where}: the entrypoint is not the server")
        flags = parse_flags(cmd + entry[1:])
        for k, _ in flags:
            check(k in defaults, f"{where}: CMD flag --{k} is not a vaedecode_server flag")
        values = effective(flags, defaults)
        exposed = sorted(int(p.split("/")[0]) for a in get("EXPOSE") for p in a.split())
        want = [port_of(values["listen"]), port_of(values["metrics_listen"])]
        if values.get("http_listen"):
            want.append(port_of(values["http_listen"]))
        check(exposed == sorted(want), f"{where}: EXPOSE {exposed} != --listen/--metrics_listen/--http_listen ports")
        hc_opts, _, hc_cmd = health.partition("CMD ")
        hc = exec_form(hc_cmd)
        hc_flags = dict(parse_flags(hc[1:]))
        check(hc[0].endswith("/vaedecode_health_probe"), f"{where}: HEALTHCHECK is not the gRPC health probe")
        check(port_of(hc_flags.get("addr", ":0")) == port_of(values["listen"]),
              f"{where}: HEALTHCHECK port != --listen port")
        m = re.search(r"--start-period=(\d+)s", hc_opts)
        check(m and int(m.group(1)) >= int(values["worker_start_timeout_s"]),
              f"{where}: HEALTHCHECK start period shorter than --worker_start_timeout_s")
        # What the test runs: the final stage's command lines and copies.
        with open(os.path.join(out_dir, f"{flavour}.cmdline"), "w") as f:
            f.write(shlex.join(entry + cmd) + "\n")
        with open(os.path.join(out_dir, f"{flavour}.healthcheck"), "w") as f:
            f.write(shlex.join(hc) + "\n")
        copies = [a for i, a in tail if i == "COPY" and "--from=build" in a]
        check(any("/stage/opt/vaedecode /opt/vaedecode" in a for a in copies),
              f"{where}: the final stage does not copy stage.sh's layout to /opt/vaedecode")
        check(any("stage.sh" in a or "image_layout.sh" in a for i, a in ins if i == "RUN"),
              f"{where}: the build stage does not lay out the image with stage.sh / image_layout.sh")
    finish("Dockerfiles")


# ------------------------------------------------------------ live Prometheus

def prom_query(url, expr):
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def substitute_vars(expr):
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def cmd_query_check(url, rules_path, dashboard, scrape):
    samples = scrape_samples(scrape)
    rules = load_rules(rules_path)
    recorded = {r["record"]: r["expr"] for r in rules if "record" in r}

    def sources(expr, seen=()):
        out = set()
        for n in metric_names(expr):
            if n in recorded and n not in seen:
                out |= sources(recorded[n], seen + (n,))
            else:
                out.add(n)
        return out

    # Every recording rule whose inputs the server exports has a value, and
    # the values make sense.
    for name, expr in recorded.items():
        needed = sources(expr)
        result = prom_query(url, name)
        if needed <= set(samples):
            if check(result, f"recording rule {name} has no value (inputs {sorted(needed)} are scraped)"):
                for s in result:
                    v = float(s["value"][1])
                    check(math.isfinite(v) and v >= 0, f"{name}{s['metric']} = {v}")
                    if "_seconds:" in name:
                        check(v <= 300, f"{name}{s['metric']} = {v} s")
                    if "ratio" in name:
                        check(v <= 1, f"{name}{s['metric']} = {v}")
                    check(s["metric"].get("namespace") == "e2e", f"{name}: lost the namespace label: {s['metric']}")
        else:
            print(f"skipped {name}: the scrape has no {sorted(needed - set(samples))}")

    # Every dashboard query parses and, when its inputs are scraped, has data.
    _, exprs = dashboard_exprs(dashboard)
    for title, expr in exprs:
        e = substitute_vars(expr)
        try:
            result = prom_query(url, e)
        except Exception as err:  # noqa: BLE001 - report every bad query
            check(False, f"dashboard '{title}': {e}: {err}")
            continue
        if sources(expr) <= set(samples):
            check(result, f"dashboard '{title}': {e} returned no data")
    finish("recording rules and dashboard queries on a live Prometheus")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {
        "metric-names": cmd_metric_names,
        "rules-sync": cmd_rules_sync,
        "prom-config": cmd_prom_config,
        "manifests": cmd_manifests,
        "dockerfiles": cmd_dockerfiles,
        "query-check": cmd_query_check,
        "render": cmd_render,
    }[cmd](*args)


if __name__ == "__main__":
    main()
