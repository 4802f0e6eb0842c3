# shellcheck shell=sh
# Sourced by every script that builds from a Go module: the Go the builds need, and PATH with the
# toolchain scripts/install-go.sh fetched first when it is there. POSIX sh, no output.
#   GO_MIN      the oldest Go the modules build with (the Kubernetes, Trainer, JobSet and Kueue
#               modules' `go` lines)
#   GO_VERSION  the toolchain install-go.sh fetches when the Go on PATH is older
GO_MIN=1.26
GO_VERSION=1.26.8
GO_HOME=${DISPATCH_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatch-k8s}/go-$GO_VERSION
if [ -x "$GO_HOME/bin/go" ]; then
  PATH=$GO_HOME/bin:$PATH
  export PATH
fi

# go_at_least: whether `go` on PATH is GO_MIN or later (go1.26.8 -> 1.26 compared by number).
go_at_least() {
  have=$(go env GOVERSION 2>/dev/null) || return 1
  have=${have#go}
  have_major=${have%%.*}
  have_rest=${have#*.}
  have_minor=${have_rest%%[!0-9]*}
  min_major=${GO_MIN%%.*}
  min_minor=${GO_MIN#*.}
  [ "$have_major" -gt "$min_major" ] 2>/dev/null && return 0
  [ "$have_major" -eq "$min_major" ] 2>/dev/null && [ "${have_minor:-0}" -ge "$min_minor" ]
}
