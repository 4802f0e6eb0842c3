# Sourced inside a container by the image's own /bin/sh (tests/images/
# helpers.bash passes this text and the prologue's): runs the prologue many
# times in one container, so a table of cases costs one container start.
# Each case is started the way the container's entry point is:
#   /bin/sh -c "$PROLOGUE" dispatch-prologue CMD...
# in a subshell holding only that case's DISPATCH_K8S_* variables.
# POSIX sh and built-ins only: the alpine image has little besides ash.
# Set before sourcing: PROLOGUE (its text); optional PROLOGUE_SH (the shell
# that runs it, default /bin/sh) and CASE_DIR (for two scratch files, /tmp):
# the host runs the same cases in its twin of the image's shell.
PROLOGUE_SH=${PROLOGUE_SH:-/bin/sh}
CASE_DIR=${CASE_DIR:-/tmp}

# try [A=..] [J=..] [P=..] [T=..] [W=..] -- CMD...: one case, one line:
#   <the case's words> -> <status> out=[<stdout>] err=[<stderr>]
# with the lines of stdout and stderr joined by a literal \n.
try() {
  dispatch_case='' dispatch_args=''
  for dispatch_word in "$@"; do
    if [ -n "$dispatch_args" ]; then
      dispatch_case="$dispatch_case '$dispatch_word'"
    elif [ "$dispatch_word" = -- ]; then
      dispatch_case="$dispatch_case--" dispatch_args=1
    else
      dispatch_case="$dispatch_case$dispatch_word "
    fi
  done
  (
    unset DISPATCH_K8S_ADMISSION DISPATCH_K8S_RESTART DISPATCH_K8S_EPOCH_PREFIX \
      DISPATCH_K8S_TOKEN_PREFIX DISPATCH_K8S_WORKDIR
    while [ "$1" != -- ]; do
      case $1 in
        A=*) export DISPATCH_K8S_ADMISSION="${1#A=}" ;;
        J=*) export DISPATCH_K8S_RESTART="${1#J=}" ;;
        P=*) export DISPATCH_K8S_EPOCH_PREFIX="${1#P=}" ;;
        T=*) export DISPATCH_K8S_TOKEN_PREFIX="${1#T=}" ;;
        W=*) export DISPATCH_K8S_WORKDIR="${1#W=}" ;;
      esac
      shift
    done
    shift
    # shellcheck disable=SC2086 # PROLOGUE_SH may be two words: busybox sh
    exec $PROLOGUE_SH -c "$PROLOGUE" dispatch-prologue "$@"
  ) >"$CASE_DIR/case.out" 2>"$CASE_DIR/case.err"
  dispatch_status=$?
  # printf, not echo: dash's echo would turn the \n into a newline.
  printf '%s\n' "$dispatch_case -> $dispatch_status out=[$(joined "$CASE_DIR/case.out")] err=[$(joined "$CASE_DIR/case.err")]"
}

# joined FILE: the file's lines joined by a literal \n.
joined() {
  dispatch_sep='' dispatch_all=''
  while IFS= read -r dispatch_line || [ -n "$dispatch_line" ]; do
    dispatch_all="$dispatch_all$dispatch_sep$dispatch_line"
    dispatch_sep='\n'
  done <"$1"
  printf '%s' "$dispatch_all"
}
