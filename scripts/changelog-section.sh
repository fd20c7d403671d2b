#!/usr/bin/env bash
# The CHANGELOG.md section of VERSION (Keep a Changelog's `## [VERSION]`),
# the release's notes; an error naming the version when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: scripts/changelog-section.sh VERSION" >&2; exit 2; }
section=$(awk -v v="$1" '
  /^## \[/ { inside = index($0, "## [" v "]") == 1; next }
  inside { print }
' CHANGELOG.md)
if [ -z "$section" ]; then
  echo "changelog-section.sh: CHANGELOG.md has no section ## [$1]" >&2
  exit 1
fi
printf '%s\n' "$section"
