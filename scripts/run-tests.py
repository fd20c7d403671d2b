#!/usr/bin/env python3
"""Runs every test binary of the workspace (as `cargo test --workspace`
would, from its package's directory) in two lanes side by side:

  guests  the binaries of tests/e2e: QEMU guests under software emulation,
          at most two at once (tests/e2e/src/guest.rs), mostly waiting on
          the guests' CPU
  host    every other binary: pvesim, kubesim, loop devices, processes;
          then the doc tests and the fuzz smoke (scripts/fuzz.sh run)

The fuzz targets are built from the start, beside both lanes, at the
lowest CPU priority (nice 19): the build takes the cores the tests leave
idle, and the smoke waits for it after the host lane's binaries.

Each binary's output is printed whole when it ends, so the lanes' lines do
not interleave. Ends with the wall time of every binary, longest first.
Exit status: 0 when every binary passed.

Usage: scripts/run-tests.py [cargo test arguments…]
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

GUEST_PACKAGES = {"e2e"}


def test_binaries(extra):
    """Package, manifest dir, target name, kind and executable of each test binary."""
    out = subprocess.run(
        ["cargo", "test", "--workspace", "--locked", "--no-run", "--message-format=json", *extra],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    found = []
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        found.append(
            {
                "package": target_package(msg),
                "dir": os.path.dirname(msg["manifest_path"]),
                "target": target["name"],
                "kind": target["kind"][0],
                "exe": msg["executable"],
            }
        )
    return found


def target_package(msg):
    # package_id: "path+file:///…/tests/e2e#0.1.0" or "…#e2e@0.1.0"
    pid = msg["package_id"]
    tail = pid.rsplit("#", 1)[-1]
    if "@" in tail:
        return tail.split("@", 1)[0]
    return os.path.basename(os.path.dirname(msg["manifest_path"]))


results = []
lock = threading.Lock()


def run_lane(name, binaries, then=()):
    for b in binaries:
        label = f"{b['package']}::{b['target']}" + (" (unit)" if b["kind"] in ("lib", "bin") else "")
        env = dict(os.environ, CARGO_MANIFEST_DIR=b["dir"], CARGO_PKG_NAME=b["package"])
        start = time.monotonic()
        proc = subprocess.run(
            [b["exe"]], cwd=b["dir"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        took = time.monotonic() - start
        with lock:
            print(f"\n==> [{name}] {label}: {b['exe']}", flush=True)
            sys.stdout.buffer.write(proc.stdout)
            verdict = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            print(f"==> [{name}] {label}: {verdict} in {took:.0f} s", flush=True)
            results.append((took, name, label, proc.returncode))
    for label, command in then:
        if callable(command):
            took, output, returncode = command()
            with lock:
                print(f"\n==> [{name}] {label}", flush=True)
                sys.stdout.buffer.write(output)
                results.append((took, name, label, returncode))
            continue
        start = time.monotonic()
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        took = time.monotonic() - start
        with lock:
            print(f"\n==> [{name}] {' '.join(command)}", flush=True)
            sys.stdout.buffer.write(proc.stdout)
            results.append((took, name, label, proc.returncode))


def fuzz_built(proc, log, started):
    """Waits for the niced fuzz build: its time since the tests began, its
    output and its exit status."""
    returncode = proc.wait()
    log.seek(0)
    return time.monotonic() - started, log.read(), returncode

def main():
    binaries = test_binaries(sys.argv[1:])
    guests = [b for b in binaries if b["package"] in GUEST_PACKAGES]
    host = [b for b in binaries if b["package"] not in GUEST_PACKAGES]
    # Doc tests are not binaries cargo lists: cargo builds and runs them.
    doc = ["cargo", "test", "--workspace", "--locked", "--doc", *sys.argv[1:]]
    fuzz = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz.sh")
    build_log = tempfile.TemporaryFile()
    started = time.monotonic()
    fuzz_build = subprocess.Popen(
        ["nice", "-n", "19", fuzz, "build"], stdout=build_log, stderr=subprocess.STDOUT
    )
    lanes = [
        threading.Thread(target=run_lane, args=("guests", guests)),
        threading.Thread(
            target=run_lane,
            args=(
                "host",
                host,
                [
                    ("doc tests", doc),
                    (
                        "fuzz build (nice 19, beside the tests)",
                        lambda: fuzz_built(fuzz_build, build_log, started),
                    ),
                    ("fuzz smoke", [fuzz, "run"]),
                ],
            ),
        ),
    ]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    print("\n==> time per test binary (two lanes side by side)")
    for took, lane, label, rc in sorted(results, reverse=True):
        mark = "" if rc == 0 else "  FAILED"
        print(f"{label:<48} {lane:<6} {took:5.0f} s{mark}")
    failed = [r for r in results if r[3] != 0]
    for _, _, label, _ in failed:
        print(f"FAILED: {label}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
