#!/usr/bin/env python3
"""Checks of the deployment, run by `make test` (tests/packaging/tests/deploy.rs):

1. the kustomize base renders (`kubectl kustomize`);
2. the Helm chart renders (Helm's engine from helm-python-sdk) and, with the
   values that mirror the base, gives exactly the base's objects;
3. every rendered object, the examples and the hostd manifests validate
   strictly against the Kubernetes schema (kubernetes-validate);
4. the node plugin's pod has no privileged container, no added capability,
   no host device or /sys mount, no host namespaces: by our own reading and by
   checkov, whose checks are first shown to catch a pod that breaks them.

Prints one line per check and `N passed, N failed` at the end; exits 1 on
any failure. Usage: check.py [--kubernetes-version 1.34]
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import kubernetes_validate
import yaml
from helm_python.chart import Chart

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.join(HERE, "helm", "proxmox-csi-plugin")
BASE = os.path.join(HERE, "kustomize")
NAMESPACE = "csi-proxmox"
RELEASE = "proxmox-csi-plugin"
# The chart's values that give the kustomize base.
BASE_VALUES = {"existingConfigSecret": "proxmox-csi-plugin", "createNamespace": True,
               "controller": {"snapshotter": {"enabled": True}}}
# Other shapes the chart must render validly.
VARIANTS = {
    "defaults with a cloud config": {
        "config": {"clusters": [{"url": "https://pve1.example.org:8006/api2/json", "token_id": "kubernetes-csi@pve!csi",
                                 "token_secret": "x", "region": "region-1"}]},
    },
    "storage classes, no snapshotter, no capacity, no metrics, k0s kubelet dir": {
        "existingConfigSecret": "mine",
        "existingConfigSecretKey": "cloud.yaml",
        "options": {"enableCapacity": False},
        "metrics": {"enabled": False},
        "controller": {"snapshotter": {"enabled": False}},
        "node": {"kubeletDir": "/var/lib/k0s/kubelet"},
        "storageClass": [
            {"name": "proxmox-lvm", "storage": "local-lvm", "cache": "none", "ssd": True,
             "extraParameters": {"diskIOPS": "4000"}, "mountOptions": ["noatime"]},
            {"name": "proxmox-zfs", "storage": "local-zfs", "reclaimPolicy": "Retain",
             "extraParameters": {"replicate": "true", "replicateZones": "pve1,pve2"}},
        ],
    },
}
# checkov checks for what the node plugin's pod must not have.
CHECKOV_POD_CHECKS = {
    "CKV_K8S_16": "privileged container",
    "CKV_K8S_20": "privilege escalation",
    "CKV_K8S_25": "added capabilities",
    "CKV_K8S_37": "capabilities not dropped",
    "CKV_K8S_39": "CAP_SYS_ADMIN",
    "CKV_K8S_17": "host PID namespace",
    "CKV_K8S_18": "host IPC namespace",
    "CKV_K8S_19": "host network",
    "CKV_K8S_22": "writable root filesystem",
}


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, name, detail=""):
        if ok:
            self.passed += 1
            print(f"ok    {name}")
        else:
            self.failed += 1
            print(f"FAIL  {name}: {detail}")


def docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def kustomize():
    out = subprocess.run(["kubectl", "kustomize", BASE], check=True, capture_output=True, text=True)
    return docs(out.stdout)


def helm(values, namespace=NAMESPACE):
    with Chart.load(CHART) as chart:
        rendered = chart.render(values=values, name=RELEASE, namespace=namespace)
    objs = []
    for text in rendered.values():
        objs.extend(docs(text))
    return objs


def key(o):
    m = o.get("metadata", {})
    return (o.get("kind"), m.get("namespace", ""), m.get("name"))


def differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a:
                out.append(f"{path}.{k}: only in the chart")
            elif k not in b:
                out.append(f"{path}.{k}: only in the base")
            else:
                out.extend(differences(a[k], b[k], f"{path}.{k}"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out.extend(differences(x, y, f"{path}[{i}]"))
        return out
    return [] if a == b else [f"{path}: base {a!r} != chart {b!r}"]


def strip_chart_only(o):
    """The chart's release bookkeeping, which the base has no use for."""
    o = copy.deepcopy(o)
    ann = o.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations", {})
    ann.pop("checksum/config", None)
    if ann == {} and "annotations" in o.get("spec", {}).get("template", {}).get("metadata", {}):
        del o["spec"]["template"]["metadata"]["annotations"]
    return o


def validate(report, objs, where, version):
    for o in objs:
        k = key(o)
        if o.get("apiVersion", "").startswith("monitoring.coreos.com/"):
            ok = pod_monitor_ok(o) if o.get("kind") == "PodMonitor" else prometheus_rule_ok(o)
            report.check(ok, f"{where}: {k[0]} {k[2]} is a valid {o['apiVersion']} object", json.dumps(o))
            continue
        if o.get("apiVersion", "").startswith("snapshot.storage.k8s.io/"):
            report.check(snapshot_class_ok(o), f"{where}: {k[0]} {k[2]} is a valid {o['apiVersion']} object", json.dumps(o))
            continue
        try:
            kubernetes_validate.validate(o, version, strict=True)
            report.check(True, f"{where}: {k[0]} {k[2]} validates against Kubernetes {version}")
        except kubernetes_validate.utils.ValidationError as e:
            report.check(False, f"{where}: {k[0]} {k[2]} validates against Kubernetes {version}", str(e).splitlines()[0])
        except Exception as e:  # a missing schema names what is wrong
            report.check(False, f"{where}: {k[0]} {k[2]} validates against Kubernetes {version}", repr(e))


def snapshot_class_ok(o):
    """VolumeSnapshotClass is a CRD, outside the core schema: its own fields."""
    allowed = {"apiVersion", "kind", "metadata", "driver", "deletionPolicy", "parameters"}
    return (o.get("kind") == "VolumeSnapshotClass" and o.get("apiVersion") == "snapshot.storage.k8s.io/v1"
            and set(o) <= allowed and bool(o.get("driver")) and o.get("deletionPolicy") in ("Delete", "Retain"))


def prometheus_rule_ok(o):
    """PrometheusRule is prometheus-operator's CRD: its own fields (rulegroups
    of alerts, each an expr, optional for/labels/annotations)."""
    groups = o.get("spec", {}).get("groups")
    if o.get("kind") != "PrometheusRule" or o.get("apiVersion") != "monitoring.coreos.com/v1" or not groups:
        return False
    rule_keys = {"alert", "expr", "for", "labels", "annotations"}
    return all(set(g) <= {"name", "rules", "interval"} and g.get("name") and g.get("rules")
               and all(set(r) <= rule_keys and r.get("alert") and r.get("expr") for r in g["rules"])
               for g in groups)


def pod_monitor_ok(o):
    """PodMonitor is prometheus-operator's CRD: a selector and endpoints naming ports."""
    spec = o.get("spec", {})
    eps = spec.get("podMetricsEndpoints") or []
    return (o.get("apiVersion") == "monitoring.coreos.com/v1" and set(spec) <= {"selector", "podMetricsEndpoints"}
            and bool(spec.get("selector", {}).get("matchLabels"))
            and bool(eps) and all(set(e) <= {"port", "path", "interval"} and e.get("port") for e in eps))


def monitoring(r, version):
    """The dashboard ConfigMap and the PrometheusRule carry the chart's files as they are."""
    values = {"dashboard": {"enabled": True}, "metrics": {"type": "podmonitor"},
              "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}
    objs = helm(values)
    validate(r, objs, "chart (dashboard and alerts)", version)
    with open(os.path.join(CHART, "files", "grafana-dashboard.json")) as f:
        dashboard = json.load(f)
    with open(os.path.join(CHART, "files", "alerts.yaml")) as f:
        alerts = yaml.safe_load(f)
    cm = next((o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")), None)
    r.check(cm is not None and cm["metadata"]["labels"].get("grafana_dashboard") == "1",
            "the dashboard ConfigMap carries Grafana's sidecar label", json.dumps(cm))
    r.check(cm is not None and json.loads(cm["data"]["proxmox-csi.json"]) == dashboard,
            "the dashboard ConfigMap holds files/grafana-dashboard.json")
    rule = next((o for o in objs if o["kind"] == "PrometheusRule"), None)
    r.check(rule is not None and rule["spec"] == alerts
            and rule["metadata"]["labels"].get("release") == "kube-prometheus-stack",
            "the PrometheusRule holds files/alerts.yaml, with prometheusRule.labels")
    default = helm({})
    r.check(not any(o["kind"] in ("PrometheusRule", "PodMonitor") or o["metadata"]["name"].endswith("-dashboard")
                    for o in default),
            "neither is rendered by default, nor a PodMonitor")
    # kube-prometheus-stack: a PodMonitor whose selector picks the controller
    # and node plugin pods, each with a `metrics` port, and no annotations.
    objs = helm({"metrics": {"type": "podmonitor", "podMonitorLabels": {"release": "kube-prometheus-stack"}}})
    validate(r, objs, "chart (PodMonitor)", version)
    pm = next((o for o in objs if o["kind"] == "PodMonitor"), None)
    pods = [o["spec"]["template"] for o in objs if o["kind"] in ("Deployment", "DaemonSet")]
    def picked(t):
        sel = pm["spec"]["selector"]["matchLabels"] if pm else {"-": "-"}
        return sel.items() <= t["metadata"]["labels"].items() and any(
            p.get("name") == "metrics" for c in t["spec"]["containers"] for p in c.get("ports", []))
    r.check(pm is not None and pm["metadata"]["labels"].get("release") == "kube-prometheus-stack"
            and len(pods) == 2 and all(picked(t) for t in pods)
            and not any("prometheus.io/scrape" in t["metadata"].get("annotations", {}) for t in pods),
            "metrics.type=podmonitor: a PodMonitor scrapes the controller's and the node plugin's metrics ports",
            json.dumps(pm))
    # The controller's sidecars serve their metrics on --http-endpoint
    # (csi-lib-utils standardflags; each sidecar's main.go at the chart's
    # tags), on a declared port the PodMonitor names.
    controller = next(t for t in pods if any(c["name"] == "csi-provisioner" for c in t["spec"]["containers"]))
    endpoints = {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} if pm else set()
    for c in controller["spec"]["containers"]:
        if c["name"] not in ("csi-attacher", "csi-provisioner", "csi-resizer", "csi-snapshotter"):
            continue
        served = [a.rsplit(":", 1)[1] for a in c["args"] if a.startswith("--http-endpoint=")]
        ports = {str(p["containerPort"]): p["name"] for p in c.get("ports", [])}
        r.check(len(served) == 1 and served[0] in ports and ports[served[0]] in endpoints,
                f"{c['name']} serves its metrics on a port the PodMonitor scrapes",
                f"args {c['args']}, ports {ports}, endpoints {sorted(endpoints)}")
    # The rule without a scrape prometheus-operator reads would fire on a
    # correct install: the chart refuses it, naming the values.
    try:
        helm({"prometheusRule": {"enabled": True}})
        refused = ""
    except Exception as e:
        refused = str(e)
    r.check("prometheusRule.enabled needs metrics.enabled=true and metrics.type=podmonitor" in refused
            and "ProxmoxCSIControllerAbsent" in refused,
            "prometheusRule.enabled with the annotations alone is refused, naming the values", refused[:300])


def timeouts(objs):
    """Each controller sidecar's --timeout."""
    pod = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: a.split("=", 1)[1] for c in pod["containers"]
            for a in c.get("args", []) if a.startswith("--timeout=")}


def sidecar_timeouts(r, base):
    """CreateVolume waits for a clone or restore within the provisioner's timeout, its
    progress on the claim as Normal events (controller/src/progress.rs); every other
    sidecar keeps `timeout`, the Go chart's 3m, as the controller holds every other
    operation to 3 minutes (ctl::OPERATION_LIMIT)."""
    got = timeouts(base)
    r.check(got.get("csi-provisioner") == "30m"
            and all(v == "3m" for k, v in got.items() if k != "csi-provisioner"),
            "the provisioner waits 30m for copies, the other sidecars 3m", str(got))
    emptied = timeouts(helm({"controller": {"provisioner": {"timeout": ""}}, "timeout": "5m"}))
    r.check(emptied.get("csi-provisioner") == "5m",
            "controller.provisioner.timeout empty: the provisioner takes `timeout`", str(emptied))


def hostd_daemonset(r, version):
    """hostd.daemonset.enabled: the chart's hostd DaemonSet is deploy/hostd/daemonset.yaml's
    pod, and it serves the node plugin the chart renders beside it: its socket, uid, group,
    plugin directory and driver name."""
    r.check(not any(o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-hostd") for o in helm({})),
            "no hostd DaemonSet by default")
    objs = helm({"hostd": {"daemonset": {"enabled": True}}})
    validate(r, objs, "chart (hostd DaemonSet)", version)
    ds = next((o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-hostd")), None)
    with open(os.path.join(HERE, "hostd", "daemonset.yaml")) as f:
        plain = yaml.safe_load(f)
    diff = differences(plain["spec"]["template"]["spec"], ds["spec"]["template"]["spec"]) if ds else ["not rendered"]
    r.check(not diff, "hostd.daemonset.enabled renders deploy/hostd/daemonset.yaml's pod", "; ".join(diff[:5]))
    for provisioner in ("csi.proxmox.sinextra.dev", "csi.example.org"):
        objs = helm({"hostd": {"daemonset": {"enabled": True}}, "provisionerName": provisioner})
        ds = next(o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-hostd"))
        node = next(o for o in objs if o["kind"] == "DaemonSet" and not o["metadata"]["name"].endswith("-hostd"))
        args = dict(a[2:].split("=", 1) for a in ds["spec"]["template"]["spec"]["containers"][0]["args"] if "=" in a)
        pspec = node["spec"]["template"]["spec"]
        plugin = pspec["containers"][0]
        sc = {**pspec.get("securityContext", {}), **plugin.get("securityContext", {})}
        plugin_dir = next(v["hostPath"]["path"] for v in pspec["volumes"] if v["name"] == "plugin-dir")
        wanted = {
            "socket": next(a.split("=", 1)[1] for a in plugin["args"] if a.startswith("--hostd-socket=")),
            "allow-uid": str(sc.get("runAsUser")),
            "socket-group": str(sc.get("runAsGroup")),
            "plugin-dir": plugin_dir,
        }
        if provisioner != "csi.proxmox.sinextra.dev":
            wanted["driver-name"] = provisioner
        wrong = {k: (args.get(k), v) for k, v in wanted.items() if args.get(k) != v}
        r.check(not wrong and plugin_dir.endswith("/" + provisioner),
                f"hostd DaemonSet serves the node plugin beside it ({provisioner})", str(wrong))


def pod_problems(ds):
    """What makes the node plugin's pod more than unprivileged."""
    spec = ds["spec"]["template"]["spec"]
    out = []
    for ns in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(ns):
            out.append(f"{ns} is set")
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']} is privileged")
        if sc.get("capabilities", {}).get("add"):
            out.append(f"{c['name']} adds capabilities {sc['capabilities']['add']}")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            out.append(f"{c['name']} does not drop every capability")
        for m in c.get("volumeMounts", []):
            if m.get("mountPropagation") == "Bidirectional":
                out.append(f"{c['name']} mounts {m['name']} Bidirectional")
    for v in spec.get("volumes", []):
        path = v.get("hostPath", {}).get("path")
        if path is not None and (path in ("/", "/dev", "/sys", "/proc") or path.startswith(("/dev/", "/sys/"))):
            out.append(f"volume {v['name']} mounts the host's {path}")
    return out


def checkov_failures(obj):
    """checkov's failed check IDs for one object."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "object.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(obj, f)
        bin_dir = os.path.dirname(sys.executable)
        run = subprocess.run(
            [os.path.join(bin_dir, "checkov"), "-f", path, "--framework", "kubernetes", "-o", "json", "--quiet", "--compact"],
            capture_output=True, text=True)
        if not run.stdout.strip():
            raise RuntimeError(f"checkov printed nothing (exit {run.returncode}): {run.stderr[-500:]}")
        out = json.loads(run.stdout)
        if isinstance(out, list):
            out = out[0]
        return {c["check_id"] for c in out.get("results", {}).get("failed_checks", [])}


def broken(ds):
    """The node DaemonSet made privileged every way the checks look for."""
    bad = copy.deepcopy(ds)
    spec = bad["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    spec["hostPID"] = True
    spec["hostIPC"] = True
    c = spec["containers"][0]
    c["securityContext"] = {"privileged": True, "allowPrivilegeEscalation": True,
                            "capabilities": {"add": ["SYS_ADMIN"]}}
    c["volumeMounts"].append({"name": "dev", "mountPath": "/dev"})
    spec["volumes"].append({"name": "dev", "hostPath": {"path": "/dev"}})
    return bad


def dotted(o, path):
    for part in path.split(".") if path else []:
        o = o.get(part) if isinstance(o, dict) else None
    return o


def go_upgrade(r):
    """`helm upgrade` of a Go chart release to this chart, in place: every
    object the Go chart made is rendered again under its kind and name, with
    the fields Kubernetes does not let an update change unchanged
    (testdata/go-chart-release.yaml says which and where they come from)."""
    testdata = os.path.join(HERE, "testdata")
    with open(os.path.join(testdata, "go-chart-values.yaml")) as fh:
        values = yaml.safe_load(fh)
    with open(os.path.join(testdata, "go-chart-release.yaml")) as fh:
        release = yaml.safe_load(fh)
    values = {**values, **release["values"]}
    for ns in ("kube-system", "csi-proxmox"):
        ours = {key(o): o for o in helm({**values, "createNamespace": ns != "kube-system"}, namespace=ns)}
        for want in release["objects"]:
            k = (want["kind"], ns if want.get("namespaced") else "", want["name"])
            got = ours.get(k)
            if got is None:
                r.check(False, f"upgrade from the Go chart in {ns}: {want['kind']} {want['name']} rendered again",
                        "helm would delete it: " + ", ".join(sorted(f"{a}/{c}" for a, _, c in ours)))
                continue
            changed = [f"{p}: Go {v!r}, here {dotted(got, p)!r}" for p, v in want["immutable"].items()
                       if dotted(got, p) != v]
            r.check(not changed, f"upgrade from the Go chart in {ns}: {want['kind']} {want['name']} keeps "
                    + ", ".join(want["immutable"]), "; ".join(changed))


def go_values(r, version):
    """The Go chart's own values.yaml and a Go user's file setting every key
    render this chart, validate, and land where the Go chart puts them."""
    testdata = os.path.join(HERE, "testdata")
    for f in ("go-chart-values.yaml", "go-values-every-key.yaml"):
        with open(os.path.join(testdata, f)) as fh:
            values = yaml.safe_load(fh)
        try:
            objs = helm(values)
            r.check(True, f"chart renders with {f}")
        except Exception as e:
            r.check(False, f"chart renders with {f}", str(e))
            continue
        validate(r, objs, f"chart ({f})", version)
        ctl = next(o for o in objs if o["kind"] == "Deployment")
        node = next(o for o in objs if o["kind"] == "DaemonSet")
        images = [c["image"] for o in (ctl, node) for c in o["spec"]["template"]["spec"]["containers"]]
        r.check(not any("sergelogvinov" in i for i in images), f"{f}: no Go driver image", ", ".join(images))
        if f == "go-chart-values.yaml":
            # Go's chart renders no Namespace for kube-system, where its
            # users install with createNamespace: true; neither does this one.
            for ns, want in (("kube-system", False), ("default", False), ("csi-proxmox", True)):
                made = helm({**values, "createNamespace": True}, namespace=ns)
                names = [o["metadata"]["name"] for o in made if o["kind"] == "Namespace"]
                r.check(names == ([ns] if want else []),
                        f"{f} with createNamespace in {ns}: {'the' if want else 'no'} Namespace rendered", str(names))
            r.check(all("--log-level=debug" in c["args"] for o in (ctl, node)
                        for c in o["spec"]["template"]["spec"]["containers"][:1]),
                    f"{f}: logVerbosityLevel 5 is debug logging of both plugins, as in the Go chart")
            switching = helm({**values, "node": {**values["node"], "updateStrategy": {"type": "OnDelete"}}})
            ds = next(o for o in switching if o["kind"] == "DaemonSet")
            dep = next(o for o in switching if o["kind"] == "Deployment")
            r.check(ds["spec"]["updateStrategy"] == {"type": "OnDelete"} and dep["spec"]["strategy"]["type"] == "RollingUpdate",
                    f"{f} with node.updateStrategy OnDelete: the node plugins switch node by node, the controller at once")
            driver = next(o for o in objs if o["kind"] == "CSIDriver")
            r.check("fsGroupPolicy" not in driver["spec"], f"{f}: CSIDriver has no fsGroupPolicy, as Go's")
            r.check(not any(c["name"] == "csi-snapshotter" for c in ctl["spec"]["template"]["spec"]["containers"]),
                    f"{f}: no snapshotter by default, as Go's")
            continue
        pod, npod = ctl["spec"]["template"], node["spec"]["template"]
        containers = {c["name"]: c for c in pod["spec"]["containers"]}
        plugin = pod["spec"]["containers"][0]
        sas = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount")
        sc = next(o for o in objs if o["kind"] == "StorageClass")
        meanings = {
            "imagePullSecrets on both pods": pod["spec"].get("imagePullSecrets") == npod["spec"].get("imagePullSecrets") == [{"name": "regcred"}],
            "serviceAccount.name and annotations": sas == ["pvecsi-controller", "pvecsi-node"]
            and pod["spec"]["serviceAccountName"] == "pvecsi-controller"
            and all(o["metadata"].get("annotations", {}).get("eks.amazonaws.com/role-arn") == "arn:x"
                    for o in objs if o["kind"] == "ServiceAccount"),
            "configFile": "--cloud-config=/etc/pve/cloud.yaml" in plugin["args"]
            and any(m["mountPath"] == "/etc/pve/" for m in plugin["volumeMounts"]),
            "top-level placement is the controller's": pod["spec"].get("nodeSelector") == values["nodeSelector"]
            and pod["spec"].get("tolerations") == values["tolerations"] and pod["spec"].get("affinity") == values["affinity"],
            "podAnnotations and podLabels": pod["metadata"]["annotations"].get("team") == "storage"
            and npod["metadata"]["annotations"].get("team") == "storage"
            and pod["metadata"]["labels"].get("tier") == npod["metadata"]["labels"].get("tier") == "infra",
            # Helm merges a user's map into the chart's default, as with the Go chart.
            "podSecurityContext": values["podSecurityContext"].items() <= pod["spec"]["securityContext"].items(),
            "securityContext": all(values["securityContext"].items() <= c["securityContext"].items()
                                   for n, c in containers.items() if n != "liveness-probe"),
            "updateStrategy": ctl["spec"]["strategy"] == values["updateStrategy"]
            and node["spec"]["updateStrategy"]["type"] == "RollingUpdate",
            "hostAliases and initContainers": pod["spec"].get("hostAliases") == values["hostAliases"]
            and pod["spec"].get("initContainers") == values["initContainers"],
            "extraVolumes and extraVolumeMounts": {"name": "ca", "configMap": {"name": "pve-ca"}} in pod["spec"]["volumes"]
            and {"name": "ca", "mountPath": "/etc/ssl/pve"} in plugin["volumeMounts"],
            "metrics.type annotation": pod["metadata"]["annotations"].get("prometheus.io/scrape") == "true"
            and pod["metadata"]["annotations"].get("prometheus.io/port") == "8081",
            "sidecar args appended": all(containers[n]["args"][-1] == a for n, a in
                                         [("csi-attacher", "--worker-threads=20"), ("csi-provisioner", "--worker-threads=30"),
                                          ("csi-resizer", "--workers=5"), ("csi-snapshotter", "--worker-threads=4")]),
            "node.driverRegistrar.args": next(c for c in npod["spec"]["containers"]
                                              if c["name"] == "csi-node-driver-registrar")["args"][-1] == "--health-port=9810",
            "storage class: first-class keys win over extraParameters": sc["parameters"]["storage"] == "local-lvm"
            and sc["parameters"]["ssd"] == "true" and sc["parameters"]["backup"] == "1",
        }
        for what, ok in meanings.items():
            r.check(ok, f"{f}: {what}, as in the Go chart")
    for bad, key in ((({"controller": {"plugin": {"image": {"tag": "v0.19.1"}}}}), "controller.plugin.image.tag"),
                     (({"node": {"plugin": {"image": {"repository": "ghcr.io/sergelogvinov/proxmox-csi-node", "tag": "edge"}}}}),
                      "node.plugin.image.repository")):
        try:
            helm(bad)
            r.check(False, f"a Go driver image under {key} is refused")
        except Exception as e:
            r.check(key in str(e), f"a Go driver image under {key} is refused, naming the key", str(e)[:200])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubernetes-version", default="1.34")
    args = ap.parse_args()
    r = Report()

    base = kustomize()
    r.check(len(base) > 0, f"kubectl kustomize renders {len(base)} objects")
    chart = [strip_chart_only(o) for o in helm(BASE_VALUES)]
    bk, ck = {key(o): o for o in base}, {key(o): o for o in chart}
    r.check(set(bk) == set(ck), "the chart and the base render the same objects",
            f"only in the base: {sorted(set(bk) - set(ck))}; only in the chart: {sorted(set(ck) - set(bk))}")
    for k in sorted(set(bk) & set(ck), key=str):
        diff = differences(bk[k], ck[k])
        r.check(not diff, f"chart = base for {k[0]} {k[2]}", "; ".join(diff[:5]))

    validate(r, base, "kustomize", args.kubernetes_version)
    sidecar_timeouts(r, base)
    go_values(r, args.kubernetes_version)
    go_upgrade(r)
    monitoring(r, args.kubernetes_version)
    hostd_daemonset(r, args.kubernetes_version)
    for name, values in VARIANTS.items():
        try:
            objs = helm(values)
            r.check(True, f"chart renders ({name})")
        except Exception as e:
            r.check(False, f"chart renders ({name})", str(e))
            continue
        validate(r, objs, f"chart ({name})", args.kubernetes_version)
    for folder in ("examples", "hostd"):
        d = os.path.join(HERE, folder)
        for f in sorted(os.listdir(d)):
            if f.endswith(".yaml"):
                with open(os.path.join(d, f)) as fh:
                    validate(r, docs(fh.read()), f"{folder}/{f}", args.kubernetes_version)

    node = next(o for o in base if o["kind"] == "DaemonSet")
    # A node without hostd: the pod starts (no hostPath that only hostd
    # makes is required to exist) and runs not ready, never restarted for it.
    spec = node["spec"]["template"]["spec"]
    paths = {v["name"]: v["hostPath"].get("type") for v in spec["volumes"] if "hostPath" in v}
    r.check(paths.get("plugin-dir") == paths.get("hostd-socket") == "DirectoryOrCreate",
            "node plugin pod starts on a node without hostd (its directories are DirectoryOrCreate)", str(paths))
    plugin = spec["containers"][0]
    r.check("readinessProbe" in plugin and "livenessProbe" not in plugin,
            "node plugin is not ready, not restarted, while hostd does not answer", json.dumps(plugin)[:300])
    problems = pod_problems(node)
    r.check(not problems, "node plugin pod: unprivileged by our reading", "; ".join(problems))
    caught = pod_problems(broken(node))
    r.check(len(caught) >= 6, "our reading catches a privileged pod", f"caught only {caught}")
    failed = checkov_failures(node)
    wanted = set(CHECKOV_POD_CHECKS)
    r.check(not (failed & wanted), "node plugin pod: checkov finds no privilege",
            ", ".join(f"{c} ({CHECKOV_POD_CHECKS[c]})" for c in sorted(failed & wanted)))
    missed = wanted - checkov_failures(broken(node))
    r.check(not missed, "checkov catches each of those in a privileged pod",
            ", ".join(f"{c} ({CHECKOV_POD_CHECKS[c]})" for c in sorted(missed)))

    print(f"{r.passed} passed, {r.failed} failed")
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
