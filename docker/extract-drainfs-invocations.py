#!/usr/bin/env python3
"""List every drainfs invocation in the Kubernetes manifests, so a test can run them for real.

Usage:
    docker/extract-drainfs-invocations.py [MANIFEST...]          # JSON on stdout
    docker/extract-drainfs-invocations.py --check [MANIFEST...]  # consistency checks, exit 1 on a problem
    docker/extract-drainfs-invocations.py --wrapper [MANIFEST...] # print the application entrypoint wrapper
    docker/extract-drainfs-invocations.py --check-comments DRAINFS_BIN [MANIFEST...]
        # every flag, DRAINFS_* variable, status path and claim in the comments agrees with the
        # binary's --help and the docs (README.md, docs/)

Without MANIFEST arguments, every *.yaml / *.yml under docker/k8s/ is read.

The JSON is a list with one entry per place a manifest runs drainfs: a container (or init
container) whose command is drainfs, or whose image is the drainfs image and so runs the
Dockerfile's ENTRYPOINT; and every exec lifecycle hook (postStart, preStop) that runs drainfs.
Each entry:

    {
      "manifest": "docker/k8s/job-native-sidecar.yaml",   # relative to the repository root
      "object": "Job/drainfs-example-job",
      "container": "drainfs",
      "source": "initContainers" | "containers" | "<containers|initContainers>.lifecycle.preStop" | ...,
      "subcommand": "run" | "cleanup" | "drain" | "wait" | ...,
      "argv": ["/usr/local/bin/drainfs", "run", "--lower", ...],
      "check_argv": [... "--check-config", "--", "gcsfuse", ...],   # `run` entries only
      "env": {"NATIVE_SIDECAR": "TRUE", "DRAINFS_GRACE_PERIOD": "60", ...},
      "termination_grace_period_seconds": 60,
      "native_sidecar_container": true      # an init container with restartPolicy: Always
    }

argv[0] is the program as the manifest (or the Dockerfile's ENTRYPOINT) names it; a test
substitutes the binary under test. `$(VAR)` references in env values and in command/args are
expanded the way the kubelet does it (`$$` escapes, unknown references are left alone). Values
that only exist at run time (valueFrom: fieldRef, secretKeyRef, ...) get a plausible literal
stand-in. `env` holds the container's whole environment as the manifest defines it; a test should
apply it on top of an environment with no DRAINFS_* or NATIVE_SIDECAR variables of its own.

For a `run` entry, running `check_argv` with `env` must exit 0 (`--check-config` validates and
prints the configuration without mounting). Other subcommands talk to a running drainfs or touch
mounts; a test can still catch flag drift by requiring that they do not exit with status 2 (usage
error), pointing their paths at a scratch directory.

Needs PyYAML. If it is missing, the script re-runs itself with docker/check.sh's virtualenv.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import sys
from pathlib import Path

LINT_VENV_PYTHON = "/opt/drainfs-docker-lint/venv/bin/python"

try:
    import yaml
except ImportError:  # pragma: no cover - depends on the machine
    if os.path.exists(LINT_VENV_PYTHON) and os.path.realpath(sys.executable) != os.path.realpath(
        LINT_VENV_PYTHON
    ):
        os.execv(LINT_VENV_PYTHON, [LINT_VENV_PYTHON, *sys.argv])
    sys.exit(
        "extract-drainfs-invocations: PyYAML is missing; run `bash docker/check.sh` once "
        f"(it creates {LINT_VENV_PYTHON}) or `pip install pyyaml`"
    )

DOCKER_DIR = Path(__file__).resolve().parent
REPO_ROOT = DOCKER_DIR.parent
DEFAULT_MANIFEST_DIR = DOCKER_DIR / "k8s"
DOCKERFILE = DOCKER_DIR / "Dockerfile"

# The name the application wrapper scripts pass as $0; used to find them.
WRAPPER_ARG0 = "drainfs-entrypoint"

# drainfs's defaults that the checks below need (src/cli.rs).
DEFAULT_GRACE_PERIOD_S = 30.0
DEFAULT_CONTROL_SOCKET_FOR_CLIENTS = "/run/drainfs/control.sock"
# Kubernetes' defaults.
K8S_DEFAULT_GRACE_S = 30
K8S_DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"

# Stand-ins for values the Downward API fills in at run time.
FIELD_REF_STAND_INS = {
    "metadata.namespace": "default",
    "metadata.uid": "3f0c6a52-8a5e-4b8e-9a55-0d6c1f1e2a77",
    "spec.nodeName": "gke-pool-1-node-1",
    "status.hostIP": "10.128.0.2",
    "status.hostIPs": "10.128.0.2",
    "status.podIP": "10.8.0.15",
    "status.podIPs": "10.8.0.15",
}


def display(path: Path) -> str:
    """A manifest's path relative to the repository root (absolute if it lies outside)."""
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return path.resolve().as_posix()


class ManifestError(Exception):
    """A construct this script cannot resolve; failing beats guessing."""


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: `$$` -> `$`, `$(NAME)` -> value, unknown refs unchanged."""
    out = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    if name in env:
                        out.append(env[name])
                    else:
                        out.append(text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def dockerfile_exec_form(instruction: str) -> list[str] | None:
    """The last `INSTRUCTION ["..."]` (exec form) in docker/Dockerfile, i.e. the final stage's."""
    found = None
    for line in DOCKERFILE.read_text().splitlines():
        m = re.match(rf"^\s*{instruction}\s+(\[.*\])\s*$", line)
        if m:
            found = json.loads(m.group(1))
    return found


def is_drainfs_image(image: str | None) -> bool:
    if not image:
        return False
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[0] == "drainfs"


def runs_drainfs(argv: list[str]) -> bool:
    return bool(argv) and posixpath.basename(argv[0]) == "drainfs"


def subcommand_of(argv: list[str]) -> str | None:
    for a in argv[1:]:
        if not a.startswith("-"):
            return a
    return None


def with_check_config(argv: list[str]) -> list[str]:
    if "--" in argv:
        i = argv.index("--")
        return [*argv[:i], "--check-config", *argv[i:]]
    return [*argv, "--check-config"]


def pod_specs(doc: dict) -> list[tuple[str, dict, dict]]:
    """(object label, pod metadata, pod spec) for the workload kinds the manifests may use."""
    kind = doc.get("kind")
    name = (doc.get("metadata") or {}).get("name", "?")
    label = f"{kind}/{name}"
    spec = doc.get("spec") or {}
    if kind == "Pod":
        return [(label, doc.get("metadata") or {}, spec)]
    if kind in ("Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
        tpl = spec.get("template") or {}
        return [(label, tpl.get("metadata") or {}, tpl.get("spec") or {})]
    if kind == "CronJob":
        tpl = ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}
        return [(label, tpl.get("metadata") or {}, tpl.get("spec") or {})]
    if kind == "PodTemplate":
        tpl = doc.get("template") or {}
        return [(label, tpl.get("metadata") or {}, tpl.get("spec") or {})]
    return []


def container_env(container: dict, pod_name: str, pod_meta: dict, pod_spec: dict) -> dict[str, str]:
    if container.get("envFrom"):
        raise ManifestError(
            f"container {container.get('name')!r} uses envFrom, whose keys this script cannot "
            "know; list the variables under env instead"
        )
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        vf = item.get("valueFrom")
        if not vf:
            env[name] = ""
            continue
        if "fieldRef" in vf:
            path = vf["fieldRef"]["fieldPath"]
            if path == "metadata.name":
                env[name] = pod_name
            elif path == "spec.serviceAccountName":
                env[name] = pod_spec.get("serviceAccountName", "default")
            elif m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
                env[name] = str((pod_meta.get(m.group(1)) or {}).get(m.group(2), ""))
            elif path in FIELD_REF_STAND_INS:
                env[name] = FIELD_REF_STAND_INS[path]
            else:
                raise ManifestError(f"env {name}: no stand-in for fieldRef {path!r}")
        elif "resourceFieldRef" in vf:
            env[name] = "1"
        elif "secretKeyRef" in vf:
            ref = vf["secretKeyRef"]
            env[name] = f"stand-in-secret-{ref.get('name')}-{ref.get('key')}"
        elif "configMapKeyRef" in vf:
            ref = vf["configMapKeyRef"]
            env[name] = f"stand-in-configmap-{ref.get('name')}-{ref.get('key')}"
        else:
            raise ManifestError(f"env {name}: unsupported valueFrom {sorted(vf)}")
    return env


def container_argv(container: dict, env: dict[str, str]) -> list[str] | None:
    """The container's argv if it runs drainfs as its main process, else None."""
    command = container.get("command")
    args = container.get("args")
    if command:
        argv = [str(a) for a in command] + [str(a) for a in (args or [])]
    elif is_drainfs_image(container.get("image")):
        entrypoint = dockerfile_exec_form("ENTRYPOINT")
        if not entrypoint:
            raise ManifestError("docker/Dockerfile has no exec-form ENTRYPOINT")
        if args is None:
            args = dockerfile_exec_form("CMD") or []
        argv = [*entrypoint, *[str(a) for a in args]]
    else:
        return None
    argv = [expand(a, env) for a in argv]
    if runs_drainfs(argv):
        return argv
    if is_drainfs_image(container.get("image")) and any("drainfs" in a for a in argv):
        raise ManifestError(
            f"container {container.get('name')!r} runs drainfs through {argv[0]!r}; its drainfs "
            "arguments cannot be extracted (run drainfs directly, or extend this script)"
        )
    return None


def invocations_in(path: Path) -> list[dict]:
    rel = display(path)
    entries = []
    with path.open() as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for doc in docs:
        for label, pod_meta, pod_spec in pod_specs(doc):
            pod_name = pod_meta.get("name") or f"{(doc.get('metadata') or {}).get('name')}-x7k2p"
            grace = pod_spec.get("terminationGracePeriodSeconds", K8S_DEFAULT_GRACE_S)
            for section in ("initContainers", "containers"):
                for c in pod_spec.get(section) or []:
                    env = container_env(c, pod_name, pod_meta, pod_spec)
                    native = section == "initContainers" and c.get("restartPolicy") == "Always"
                    base = {
                        "manifest": rel,
                        "object": label,
                        "container": c["name"],
                        "termination_grace_period_seconds": grace,
                        "native_sidecar_container": native,
                    }
                    argv = container_argv(c, env)
                    if argv is not None:
                        sub = subcommand_of(argv)
                        entry = {**base, "source": section, "subcommand": sub, "argv": argv}
                        if sub == "run":
                            entry["check_argv"] = with_check_config(argv)
                        entry["env"] = env
                        entries.append(entry)
                    for hook in ("postStart", "preStop"):
                        handler = ((c.get("lifecycle") or {}).get(hook)) or {}
                        hook_argv = [str(a) for a in ((handler.get("exec") or {}).get("command") or [])]
                        if runs_drainfs(hook_argv):
                            entries.append(
                                {
                                    **base,
                                    "source": f"{section}.lifecycle.{hook}",
                                    "subcommand": subcommand_of(hook_argv),
                                    "argv": hook_argv,
                                    "env": env,
                                }
                            )
    return entries


# ------------------------------------------------------------------------------------------------
# --check: rules that keep the manifests consistent with drainfs and with Kubernetes semantics.


def parse_duration_s(text: str) -> float:
    """The subset of drainfs's duration syntax the manifests use: `30`, `30s`, `1500ms`, `2m`."""
    t = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?", t)
    if not m:
        raise ManifestError(f"cannot parse duration {text!r}")
    n = float(m.group(1))
    return n * {"ms": 0.001, None: 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def flag_value(argv: list[str], flag: str) -> str | None:
    """Value of --flag VALUE / --flag=VALUE among drainfs's own arguments (before `--`)."""
    own = argv[: argv.index("--")] if "--" in argv else argv
    value = None
    for i, a in enumerate(own):
        if a == flag and i + 1 < len(own):
            value = own[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def flag_values(argv: list[str], flag: str) -> list[str]:
    own = argv[: argv.index("--")] if "--" in argv else argv
    out = []
    for i, a in enumerate(own):
        if a == flag and i + 1 < len(own):
            out.append(own[i + 1])
        elif a.startswith(flag + "="):
            out.append(a.split("=", 1)[1])
    return out


def setting(entry: dict, flag: str, env_name: str) -> str | None:
    """A drainfs setting the way clap resolves it: the flag wins over the env var."""
    v = flag_value(entry["argv"], flag)
    return v if v is not None else entry["env"].get(env_name)


def is_true(value: str | None) -> bool:
    # As Go's strconv.ParseBool (and drainfs) read it.
    return value is not None and value in ("1", "t", "T", "TRUE", "true", "True")


def find_pod_spec(manifest: str, obj: str) -> dict:
    with (REPO_ROOT / manifest).open() as f:  # absolute paths stay absolute
        for doc in yaml.safe_load_all(f):
            if not doc:
                continue
            for label, _meta, spec in pod_specs(doc):
                if label == obj:
                    return spec
    raise ManifestError(f"{manifest}: {obj} vanished")


def uses_gke_managed_sidecar(manifest: Path) -> bool:
    """Whether a pod of `manifest` selects the GKE CSI driver's sidecar image by declaring a
    `gke-gcsfuse-sidecar` container: drainfs then runs as that sidecar's /gcsfuse (the
    relay image), with no command line in the manifest to check."""
    with manifest.open() as f:
        for doc in yaml.safe_load_all(f):
            if not doc:
                continue
            for _label, meta, spec in pod_specs(doc):
                annotated = (meta.get("annotations") or {}).get("gke-gcsfuse/volumes") == "true"
                named = any(c.get("name") == "gke-gcsfuse-sidecar" for _s, c in all_containers(spec))
                if annotated and named:
                    return True
    return False


def all_containers(spec: dict) -> list[tuple[str, dict]]:
    return [(s, c) for s in ("initContainers", "containers") for c in spec.get(s) or []]


def volume_for(container: dict, path: str) -> dict | None:
    """The volumeMount of `container` that holds `path` (longest mountPath prefix)."""
    best = None
    for vm in container.get("volumeMounts") or []:
        mp = vm["mountPath"].rstrip("/")
        if (path == mp or path.startswith(mp + "/")) and (
            best is None or len(mp) > len(best["mountPath"].rstrip("/"))
        ):
            best = vm
    return best


def check(entries: list[dict], manifests: list[Path]) -> list[str]:
    problems: list[str] = []
    by_manifest: dict[str, list[dict]] = {}
    for e in entries:
        by_manifest.setdefault(e["manifest"], []).append(e)

    for m in manifests:
        rel = display(m)
        runs = [e for e in by_manifest.get(rel, []) if e["subcommand"] == "run"]
        if not runs and not uses_gke_managed_sidecar(m):
            problems.append(f"{rel}: no container runs `drainfs run`")

    for e in entries:
        where = f"{e['manifest']}: {e['object']} container {e['container']} ({e['source']})"
        for s in [*e["argv"], *e["env"].values()]:
            if "$(" in s:
                problems.append(f"{where}: unresolved reference in {s!r}")
        spec = find_pod_spec(e["manifest"], e["object"])
        containers = all_containers(spec)
        me = next(c for s, c in containers if c["name"] == e["container"])

        if e["subcommand"] == "run":
            # Grace period: the Downward API cannot expose it, so it is copied by hand.
            gp = setting(e, "--grace-period", "DRAINFS_GRACE_PERIOD")
            gp_s = parse_duration_s(gp) if gp is not None else DEFAULT_GRACE_PERIOD_S
            if gp_s != float(e["termination_grace_period_seconds"]):
                problems.append(
                    f"{where}: drainfs grace period {gp_s:g}s != pod "
                    f"terminationGracePeriodSeconds {e['termination_grace_period_seconds']}"
                )
            native = is_true(e["env"].get("NATIVE_SIDECAR")) or is_true(
                setting(e, "--native-sidecar", "DRAINFS_NATIVE_SIDECAR")
            ) or "--native-sidecar" in e["argv"][: e["argv"].index("--") if "--" in e["argv"] else None]
            if e["native_sidecar_container"] and not native:
                problems.append(f"{where}: a native sidecar must set NATIVE_SIDECAR=TRUE")
            if not e["native_sidecar_container"] and native:
                problems.append(
                    f"{where}: NATIVE_SIDECAR set on a regular container: SIGTERM reaches it "
                    "together with the application, not after it"
                )
            exit_files = flag_values(e["argv"], "--exit-file")
            if not exit_files and e["env"].get("DRAINFS_EXIT_FILE"):
                exit_files = e["env"]["DRAINFS_EXIT_FILE"].split(",")
            watch_pid = setting(e, "--watch-pid", "DRAINFS_WATCH_PID")
            if not e["native_sidecar_container"] and not exit_files and not watch_pid:
                problems.append(
                    f"{where}: a regular sidecar needs --exit-file or --watch-pid, or it never "
                    "learns that the application has finished"
                )
            # Exit and ready files must be on a volume some other container also mounts.
            ready = setting(e, "--ready-file", "DRAINFS_READY_FILE")
            for p in [*exit_files, *([ready] if ready else [])]:
                vm = volume_for(me, p)
                shared = vm is not None and any(
                    c is not me and any(v["name"] == vm["name"] for v in c.get("volumeMounts") or [])
                    for _s, c in containers
                )
                if not shared:
                    problems.append(f"{where}: {p} is not on a volume shared with another container")
            # Termination log must be where the kubelet reads the termination message.
            tl = setting(e, "--termination-log", "DRAINFS_TERMINATION_LOG")
            tmp = me.get("terminationMessagePath", K8S_DEFAULT_TERMINATION_MESSAGE_PATH)
            if tl is not None and tl != tmp:
                problems.append(f"{where}: termination log {tl} != terminationMessagePath {tmp}")
            # Mount propagation: drainfs's mountpoint must reach the other containers.
            mp = setting(e, "--mountpoint", "DRAINFS_MOUNTPOINT")
            vm = volume_for(me, mp) if mp else None
            if vm is None or vm.get("mountPath").rstrip("/") != mp.rstrip("/"):
                problems.append(f"{where}: --mountpoint {mp} is not a volume mount of its own")
            else:
                if vm.get("mountPropagation") != "Bidirectional":
                    problems.append(f"{where}: {mp} needs mountPropagation: Bidirectional")
                if not (me.get("securityContext") or {}).get("privileged"):
                    problems.append(f"{where}: Bidirectional propagation needs privileged: true")
                for s, c in containers:
                    if c is me:
                        continue
                    for v in c.get("volumeMounts") or []:
                        if v["name"] != vm["name"]:
                            continue
                        prop = v.get("mountPropagation", "None")
                        if s == "containers" and prop not in ("HostToContainer", "Bidirectional"):
                            problems.append(
                                f"{e['manifest']}: container {c['name']} mounts {vm['name']} "
                                f"with propagation {prop}: it would never see drainfs's mount"
                            )
            # The hooks' client subcommands must reach this drainfs's control socket.
            run_socket = setting(e, "--control-socket", "DRAINFS_CONTROL_SOCKET")
            for h in entries:
                if (
                    h["manifest"] == e["manifest"]
                    and h["object"] == e["object"]
                    and h["subcommand"] in ("drain", "wait", "status", "shutdown")
                ):
                    hs = flag_value(h["argv"], "--control-socket") or h["env"].get(
                        "DRAINFS_CONTROL_SOCKET", DEFAULT_CONTROL_SOCKET_FOR_CLIENTS
                    )
                    if run_socket is None:
                        problems.append(
                            f"{where}: `drainfs {h['subcommand']}` in {h['container']} needs a "
                            "control socket, and `drainfs run` has none (--control-socket)"
                        )
                    elif hs != run_socket:
                        problems.append(
                            f"{where}: `drainfs {h['subcommand']}` in {h['container']} uses "
                            f"{hs}, drainfs listens on {run_socket}"
                        )
                    elif h["container"] != e["container"] and volume_for(
                        next(c for _s, c in containers if c["name"] == h["container"]), hs
                    ) is None:
                        problems.append(f"{where}: {hs} is not visible in {h['container']}")

    wrappers = wrapper_scripts(manifests)
    if len({w for _where, w in wrappers}) > 1:
        problems.append(
            "application entrypoint wrappers differ between "
            + ", ".join(where for where, _w in wrappers)
            + "; keep them identical"
        )
    return problems


def wrapper_scripts(manifests: list[Path]) -> list[tuple[str, str]]:
    """(where, script) for every container whose command is `sh -c SCRIPT drainfs-entrypoint`."""
    found = []
    for m in manifests:
        rel = display(m)
        with m.open() as f:
            for doc in yaml.safe_load_all(f):
                if not doc:
                    continue
                for label, _meta, spec in pod_specs(doc):
                    for _s, c in all_containers(spec):
                        cmd = c.get("command") or []
                        if len(cmd) == 4 and cmd[1] == "-c" and cmd[3] == WRAPPER_ARG0:
                            found.append((f"{rel}: {label} container {c['name']}", cmd[2]))
    return found


# --- what the manifests' comments claim ------------------------------------------------------
# `--flags` a comment may name that are not drainfs's: the task's own flag in the Airflow
# operator example, and Docker's in a build command.
FOREIGN_COMMENT_FLAGS = {"--out", "--target"}
# Variables a manifest may name that no `--help` lists: the drop-in's real gcsfuse, and the
# image build's knob for the relay image's admin address.
EXTRA_VARIABLES = {"DRAINFS_REAL_GCSFUSE", "DRAINFS_RELAY_ADMIN_ADDR"}
STATUS_PATH = re.compile(
    r"(initContainerStatuses|containerStatuses)\[\?\(@\.name==\s*\"([^\"]+)\"\)\]\s*((?:\.\s*\w+)+)"
)


def drainfs_help(binary: str) -> tuple[set[str], set[str]]:
    """Every flag and every `[env: NAME=]` variable in the binary's `--help` texts."""
    import subprocess

    flags: set[str] = set()
    env: set[str] = set()
    top = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    subs = re.findall(r"^  ([a-z]+)\s{2,}", top.split("Commands:")[1].split("Options:")[0], re.M)
    for sub in ["", *(s for s in subs if s != "help")]:
        argv = [binary, *([sub] if sub else []), "--help"]
        text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        flags |= set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
        env |= set(re.findall(r"\[env: (\w+)=", text))
    return flags, env


def comment_paragraphs(path: Path) -> list[tuple[str, str]]:
    """The manifest's comments, one string per block of comment lines (`#` stripped), each with
    the line of YAML that follows it (what the comment describes)."""
    paras, cur = [], []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (" # " in line and not stripped.startswith("-")):
            text = stripped.lstrip("#").strip() if stripped.startswith("#") else line.split(" # ", 1)[1]
            if text:
                cur.append(text)
                continue
        if cur:
            paras.append((" ".join(cur), stripped))
            cur = []
    if cur:
        paras.append((" ".join(cur), ""))
    return paras


def init_container_names(path: Path) -> set[str]:
    names = set()
    with path.open() as f:
        for doc in yaml.safe_load_all(f):
            for _label, _meta, spec in pod_specs(doc or {}):
                names |= {c.get("name") for c in spec.get("initContainers") or []}
    return names


def check_status_paths(where: str, text: str, init_names: set[str] | None) -> list[str]:
    """A termination message is read from `.state.terminated.message` (`lastState` is empty
    after a container's first, normal stop), in the list its container is in."""
    problems = []
    for kind, name, path in STATUS_PATH.findall(text):
        path = re.sub(r"\s+", "", path)
        if path != ".state.terminated.message":
            problems.append(f"{where}: {kind}[{name}]{path}: the summary is at .state.terminated.message")
        if init_names is not None and (kind == "initContainerStatuses") != (name in init_names):
            problems.append(f"{where}: {name} is read from {kind}, but it is "
                            f"{'an init' if name in init_names else 'a regular'} container here")
    return problems


def check_comments(manifests: list[Path], binary: str) -> list[str]:
    """Every flag, `DRAINFS_*` variable, status path and claim in the manifests' comments is
    one the binary and the docs agree on."""
    flags, env = drainfs_help(binary)
    env |= EXTRA_VARIABLES
    problems = []
    for m in manifests:
        rel = display(m)
        text = m.read_text()
        for var in sorted(set(re.findall(r"\bDRAINFS_[A-Z0-9_]+", text))):
            if var not in env:
                problems.append(f"{rel}: {var} is not a variable drainfs reads (no --help lists it)")
        for para, described in comment_paragraphs(m):
            for flag in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", para))):
                if flag not in flags and flag not in FOREIGN_COMMENT_FLAGS:
                    problems.append(f"{rel}: a comment names {flag}, which is no drainfs flag")
            for sentence in re.split(r"(?<=[.;])\s", para):
                if "SIGINT" in sentence and "CAP_SYS_ADMIN" not in sentence:
                    problems.append(f"{rel}: \"{sentence}\": drainfs sends gcsfuse SIGINT only "
                                    "without CAP_SYS_ADMIN (as root it unmounts gcsfuse's mount)")
                if (re.search(r"\bwait\b", sentence) or re.search(r"\bwait\b", described)) \
                        and "exit 75" in sentence:
                    problems.append(f"{rel}: \"{sentence}\": `drainfs wait` times out with 124")
            if "/bin/sh" in para and ("drainfs run" in para or "exec drainfs" in para) \
                    and "has no shell" not in para:
                problems.append(f"{rel}: a comment runs drainfs under /bin/sh without saying "
                                "the drainfs image has no shell")
            if re.search(r"\bREADME\b", para):
                problems.append(f"{rel}: a comment points to the README; the details are in docs/")
            for doc in re.findall(r"\bdocs/[\w.-]+\.md", para):
                if not (REPO_ROOT / doc).is_file():
                    problems.append(f"{rel}: a comment points to {doc}, which does not exist")
            names = init_container_names(m)
            if uses_gke_managed_sidecar(m):
                names.add("gke-gcsfuse-sidecar")
            problems += check_status_paths(rel, para, names)
    for doc in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        problems += check_status_paths(display(doc), doc.read_text(), None)
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="run the consistency checks")
    mode.add_argument("--wrapper", action="store_true", help="print the entrypoint wrapper script")
    mode.add_argument("--check-comments", metavar="DRAINFS_BIN",
                      help="check the comments' flags, variables, status paths and claims against the binary")
    ap.add_argument("manifests", nargs="*", type=Path)
    a = ap.parse_args()
    manifests = a.manifests or sorted(
        p for p in DEFAULT_MANIFEST_DIR.iterdir() if p.suffix in (".yaml", ".yml")
    )
    try:
        entries = [e for m in manifests for e in invocations_in(m)]
        if a.wrapper:
            wrappers = wrapper_scripts(manifests)
            if not wrappers:
                print("no entrypoint wrapper found", file=sys.stderr)
                return 1
            sys.stdout.write(wrappers[0][1])
            return 0
        if a.check_comments:
            problems = check_comments(manifests, a.check_comments)
            for p in problems:
                print(f"error: {p}", file=sys.stderr)
            if problems:
                return 1
            print(f"ok: the comments of {len(manifests)} manifests agree with {a.check_comments} --help and the docs")
            return 0
        if a.check:
            problems = check(entries, manifests)
            for p in problems:
                print(f"error: {p}", file=sys.stderr)
            if problems:
                return 1
            runs = sum(1 for e in entries if e["subcommand"] == "run")
            print(
                f"ok: {len(entries)} drainfs invocations ({runs} `run`) in {len(manifests)} "
                "manifests are consistent"
            )
            return 0
    except ManifestError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    json.dump(entries, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
