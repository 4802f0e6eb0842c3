#!/usr/bin/env bash
# Runs the prologue suites once per shell. A missing shell fails the run.
# Prints the number of cases per shell and the total.
set -uo pipefail
cd "$(dirname "$0")" || exit 1
BATS=${BATS:-../../.venv/bin/bats}
SHELLS=(dash bash bash-posix busybox posh mksh yash ksh93 zsh)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# zsh emulates sh only when started under the name sh.
ln -s /usr/bin/zsh "$tmp/sh"
export ZSH_AS_SH=$tmp/sh
failed=0 total=0 summary=()
for s in "${SHELLS[@]}"; do
  echo "# prologue suite in $s"
  out=$(SHELL_NAME=$s "$BATS" --jobs 1 contract.bats forks.bats 2>&1)
  rc=$?
  printf '%s\n' "$out"
  n=$(grep -cE '^(ok|not ok) ' <<<"$out")
  bad=$(grep -cE '^not ok ' <<<"$out")
  summary+=("$(printf '%-11s %3d cases, %d failed' "$s" "$n" "$bad")")
  total=$((total + n))
  if [[ $rc -ne 0 || $n -eq 0 ]]; then failed=1; fi
done
echo "# shellcheck"
"$BATS" shellcheck.bats || failed=1
echo "# prologue cases per shell:"
printf '#   %s\n' "${summary[@]}"
echo "#   total: $total cases in ${#SHELLS[@]} shells"
exit $failed
