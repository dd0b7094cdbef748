#!/usr/bin/env python3
"""Runs Job-shaped static pods on the node that up.sh started, one at a time, and times them.

Each pod (restartPolicy: Never, hostNetwork) has a native sidecar (an init container with
restartPolicy: Always: `testbin sidecar /out`) and one workload container (`testbin job /out
SLEEP_MS`), both the local image local.drainfs/testbin:1, sharing a hostPath volume into which
they write UNIX-ns timestamps: sidecar.start, job.start, job.exit, sidecar.term. The script
writes the manifest into the kubelet's static pod path, polls the kubelet's /pods (read-only
port) every POLL seconds for the pod's phase, and reads the containers' state and exit codes
through crictl. Then it removes the manifest and waits for the sandbox to go.

Reported per pod, in ms: job.exit -> sidecar SIGTERMed (sidecar.term), job.exit -> phase
Succeeded seen at the kubelet's /pods, job.exit -> the sandbox NOTREADY in crictl; plus the
exit codes and crictl's finishedAt of both containers. Results: a table on stdout and
$K8S_NODE_WORK/results/job-pods.json.

Usage: job-pods.py [COUNT [SLEEP_MS]]   (default 5 pods, 2000 ms)
Exit codes: 0 every pod's workload exited 0, its sidecar started before it and was SIGTERMed
after it, and the kubelet reported Succeeded; 1 otherwise (what went wrong is printed);
2 the node is not up.
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.environ.get("K8S_NODE_ROOT", "/opt/drainfs-k8s")
WORK = os.environ.get("K8S_NODE_WORK", ROOT + "/work")
SOCK = "unix://" + os.environ.get("K8S_NODE_RUN", "/run/drainfs-k8s") + "/containerd.sock"
PORT = os.environ.get("K8S_NODE_RO_PORT", "10255")
NODE = "drainfs-k8s-node"
POLL = 0.05
TIMEOUT = 120

MANIFEST = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  hostNetwork: true
  restartPolicy: Never
  terminationGracePeriodSeconds: 30
  initContainers:
  - name: sidecar
    image: local.drainfs/testbin:1
    imagePullPolicy: Never
    restartPolicy: Always
    args: [sidecar, /out]
    volumeMounts: [{{name: out, mountPath: /out}}]
  containers:
  - name: job
    image: local.drainfs/testbin:1
    imagePullPolicy: Never
    args: [job, /out, "{sleep_ms}"]
    volumeMounts: [{{name: out, mountPath: /out}}]
  volumes:
  - name: out
    hostPath: {{path: {dir}, type: DirectoryOrCreate}}
"""


def crictl(*args):
    cmd = [ROOT + "/bin/crictl", "--runtime-endpoint", SOCK, "--image-endpoint", SOCK,
           "--timeout", "10s", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def kubelet_pod(full_name):
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/pods", timeout=5) as r:
        pods = json.load(r)
    for p in pods.get("items") or []:
        if p["metadata"]["name"] == full_name:
            return p
    return None


def sandbox(name):
    out = json.loads(crictl("pods", "--name", name, "-o", "json"))
    items = out.get("items") or []
    return items[0] if items else None


def stamps(d):
    res = {}
    for f in os.listdir(d):
        for key in ("sidecar.start", "job.start", "job.exit", "sidecar.term"):
            if f.endswith("-" + key):
                res[key] = int(open(os.path.join(d, f)).read().strip())
    return res


def run_one(i, sleep_ms):
    name = f"job-{os.getpid()}-{i}"
    full = f"{name}-{NODE}"
    d = f"{WORK}/hostpath/{name}"
    manifest = f"{WORK}/manifests/{name}.yaml"
    r = {"pod": full, "errors": []}
    # The kubelet reads every file of the static pod path but those whose names start with a
    # dot: the manifest is written under such a name, then renamed into place.
    tmp = f"{WORK}/manifests/.{name}.yaml"
    with open(tmp, "w") as f:
        f.write(MANIFEST.format(name=name, sleep_ms=sleep_ms, dir=d))
    t_manifest = time.time_ns()
    os.rename(tmp, manifest)
    phases = []
    t_succeeded = t_notready = None
    deadline = time.time() + TIMEOUT
    while time.time() < deadline and (t_succeeded is None or t_notready is None):
        now = time.time_ns()
        p = kubelet_pod(full)
        phase = (p or {}).get("status", {}).get("phase")
        if phase and (not phases or phases[-1][0] != phase):
            phases.append((phase, now))
        if phase == "Succeeded" and t_succeeded is None:
            t_succeeded = now
        if phase == "Failed":
            r["errors"].append("phase Failed: " + json.dumps(p.get("status")))
            break
        if t_notready is None and os.path.exists(d) and "job.exit" in stamps(d):
            sb = sandbox(full)
            if sb and sb["state"] == "SANDBOX_NOTREADY":
                t_notready = time.time_ns()
        time.sleep(POLL)
    if t_succeeded is None:
        r["errors"].append(f"no phase Succeeded within {TIMEOUT}s; phases seen: {phases}")
    s = stamps(d) if os.path.isdir(d) else {}
    r["stamps_ns"] = s
    r["phases"] = [(ph, (t - t_manifest) / 1e6) for ph, t in phases]
    # The containers as containerd has them.
    sb = sandbox(full)
    ctrs = json.loads(crictl("ps", "-a", "-o", "json", "--pod", sb["id"]))["containers"] if sb else []
    for c in ctrs:
        info = json.loads(crictl("inspect", c["id"]))["status"]
        r[c["metadata"]["name"]] = {"state": info["state"], "exitCode": info.get("exitCode"),
                                    "startedAt": info.get("startedAt"),
                                    "finishedAt": info.get("finishedAt"), "reason": info.get("reason")}
    for need in ("sidecar.start", "job.start", "job.exit", "sidecar.term"):
        if need not in s:
            r["errors"].append(f"no {need} stamp")
    if not r["errors"]:
        if not s["sidecar.start"] < s["job.start"]:
            r["errors"].append("sidecar did not start before the job")
        if not s["sidecar.term"] > s["job.exit"]:
            r["errors"].append("sidecar was not SIGTERMed after the job exited")
        if r.get("job", {}).get("exitCode") != 0:
            r["errors"].append(f"job container: {r.get('job')}")
        ex = s["job.exit"]
        r["ms"] = {
            "manifest->sidecar.start": (s["sidecar.start"] - t_manifest) / 1e6,
            "sidecar.start->job.start": (s["job.start"] - s["sidecar.start"]) / 1e6,
            "job.exit->sidecar.term": (s["sidecar.term"] - ex) / 1e6,
            "job.exit->Succeeded@/pods": (t_succeeded - ex) / 1e6,
            "job.exit->sandbox NOTREADY": (t_notready - ex) / 1e6 if t_notready else None,
        }
    os.unlink(manifest)
    deadline = time.time() + 60
    while time.time() < deadline and (sandbox(full) or kubelet_pod(full)):
        time.sleep(0.2)
    return r


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    sleep_ms = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{PORT}/pods", timeout=5).read()
    except OSError as e:
        print(f"job-pods.py: the kubelet's read-only port does not answer ({e}): run up.sh", file=sys.stderr)
        return 2
    results = [run_one(i, sleep_ms) for i in range(count)]
    os.makedirs(f"{WORK}/results", exist_ok=True)
    with open(f"{WORK}/results/job-pods.json", "w") as f:
        json.dump(results, f, indent=1)
    keys = ["manifest->sidecar.start", "sidecar.start->job.start", "job.exit->sidecar.term",
            "job.exit->Succeeded@/pods", "job.exit->sandbox NOTREADY"]
    print("pod | " + " | ".join(keys) + " | job exit | sidecar exit")
    bad = 0
    for r in results:
        if r["errors"]:
            bad += 1
            print(r["pod"], "ERRORS:", r["errors"], json.dumps({k: r.get(k) for k in ("job", "sidecar", "phases")}))
            continue
        ms = r["ms"]
        print(r["pod"] + " | " + " | ".join("-" if ms[k] is None else f"{ms[k]:.0f}" for k in keys)
              + f" | {r['job']['exitCode']} | {r.get('sidecar', {}).get('exitCode')}")
    print(f"{count - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
