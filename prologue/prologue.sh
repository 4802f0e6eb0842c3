#!/bin/sh
# dispatch prologue (docs/prologue.md). The loop is the fast path: valid
# input reaches the exec, anything else breaks out to the rules that follow,
# which the shell parses only then.
set -eu
DISPATCH_K8S_EDGE=
while :; do
  case ${DISPATCH_K8S_ADMISSION-} in
    '' | 0* | *[!0123456789]* | ???????*) break ;;
  esac
  case ${DISPATCH_K8S_RESTART-} in
    '' | 0?* | *[!0123456789]* | ???????*) break ;;
  esac
  DISPATCH_K8S_R=$((DISPATCH_K8S_ADMISSION + DISPATCH_K8S_RESTART))
  case $DISPATCH_K8S_R in
    ???????) break ;;
  esac
  case ${DISPATCH_K8S_EPOCH_PREFIX+s}${DISPATCH_K8S_EPOCH_PREFIX-} in
    s) DISPATCH_EPOCH=$DISPATCH_K8S_R ;;
    '' | s0* | s*[!0123456789]* | s??????????????*) break ;;
    *)
      DISPATCH_EPOCH=$((DISPATCH_K8S_R + 1000000))
      DISPATCH_EPOCH=$DISPATCH_K8S_EPOCH_PREFIX${DISPATCH_EPOCH#1}
      ;;
  esac
  case ${DISPATCH_K8S_TOKEN_PREFIX-} in
    '' | *[!"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!\"#\$%&'()*+,-./:;<=>?@[\\]^_\`{|}~"]*) break ;;
  esac
  case ${1-} in
    '' | -*) break ;;
  esac
  case ${DISPATCH_K8S_WORKDIR-} in
    '') ;;
    /*) cd "$DISPATCH_K8S_WORKDIR" 2>/dev/null || break ;;
    *) cd "./$DISPATCH_K8S_WORKDIR" 2>/dev/null || break ;;
  esac
  case $DISPATCH_K8S_EPOCH_PREFIX in
    ?????????????) DISPATCH_K8S_EDGE=1; break ;;
  esac
  export DISPATCH_EPOCH "DISPATCH_ATTEMPT=$DISPATCH_K8S_TOKEN_PREFIX.$DISPATCH_K8S_ADMISSION.$DISPATCH_K8S_RESTART"
  unset DISPATCH_K8S_ADMISSION DISPATCH_K8S_RESTART DISPATCH_K8S_EPOCH_PREFIX \
    DISPATCH_K8S_TOKEN_PREFIX DISPATCH_K8S_WORKDIR DISPATCH_K8S_R DISPATCH_K8S_EDGE
  # shellcheck disable=SC2093 # exec does not return: a failed one exits the shell (126/127)
  exec "$@"
done

# The int64 edge: only a 13-digit prefix (G >= 10^6) can pass
# 9223372036854775807. For equal lengths numeric order is text order, so the
# prefix is compared digit by digit with 9223372036854, then R with 775807
# (no 64-bit arithmetic: mksh's integers are 32-bit).
# When it fits, the same three lines as at the end of the loop run here (a
# deliberate second copy: a function would cost every start its definition).
case $DISPATCH_K8S_EDGE/${DISPATCH_K8S_EPOCH_PREFIX-} in
  1/9223372036854) [ "$DISPATCH_K8S_R" -gt 775807 ] || DISPATCH_K8S_EDGE=fits ;;
  1/9[3456789]??????????? | 1/92[3456789]?????????? | 1/922[456789]????????? | \
    1/9223[456789]???????? | 1/92233[89]??????? | 1/922337[3456789]?????? | \
    1/9223372[123456789]????? | 1/92233720[456789]???? | 1/922337203[789]??? | \
    1/9223372036[9]?? | 1/92233720368[6789]? | 1/922337203685[56789]) ;;
  1/*) DISPATCH_K8S_EDGE=fits ;;
esac
case $DISPATCH_K8S_EDGE in
  fits)
    export DISPATCH_EPOCH "DISPATCH_ATTEMPT=$DISPATCH_K8S_TOKEN_PREFIX.$DISPATCH_K8S_ADMISSION.$DISPATCH_K8S_RESTART"
    unset DISPATCH_K8S_ADMISSION DISPATCH_K8S_RESTART DISPATCH_K8S_EPOCH_PREFIX \
      DISPATCH_K8S_TOKEN_PREFIX DISPATCH_K8S_WORKDIR DISPATCH_K8S_R DISPATCH_K8S_EDGE
    exec "$@"
    ;;
esac

# Refused. The rules in full, in order; the first one broken is the one line
# printed, and nothing runs.
dispatch_k8s_refuse() {
  echo "dispatch: $1" >&2
  exit 125
}
# A and J: "0", or 1 to 6 digits without a leading zero; digits are listed,
# never a range (a range depends on the locale). Shells disagree on 010
# (octal or decimal) and wrap on overflow, so no arithmetic runs before this.
# A = 0 was never admitted through dispatch, and its R could repeat a later one's.
case ${DISPATCH_K8S_ADMISSION-} in
  0) dispatch_k8s_refuse "DISPATCH_K8S_ADMISSION is 0: this execution was not admitted through dispatch" ;;
  '') dispatch_k8s_refuse "DISPATCH_K8S_ADMISSION is empty or not set" ;;
  0* | *[!0123456789]* | ???????*)
    dispatch_k8s_refuse "DISPATCH_K8S_ADMISSION is not 0 or a decimal of at most 6 digits without a leading zero" ;;
esac
case ${DISPATCH_K8S_RESTART-} in
  0) ;;
  '') dispatch_k8s_refuse "DISPATCH_K8S_RESTART is empty or not set" ;;
  0* | *[!0123456789]* | ???????*)
    dispatch_k8s_refuse "DISPATCH_K8S_RESTART is not 0 or a decimal of at most 6 digits without a leading zero" ;;
esac
DISPATCH_K8S_R=$((DISPATCH_K8S_ADMISSION + DISPATCH_K8S_RESTART))
case $DISPATCH_K8S_R in
  ???????) dispatch_k8s_refuse "R = A + J = $DISPATCH_K8S_R reached the bound 1000000" ;;
esac
# Set (yash takes a value it cannot decode for unset), and empty or 1 to 13
# digits without a leading zero; R follows it in six digits.
case ${DISPATCH_K8S_EPOCH_PREFIX+set} in
  '') dispatch_k8s_refuse "DISPATCH_K8S_EPOCH_PREFIX is not set (the packager sets it, to empty when G and N are 0)" ;;
esac
case $DISPATCH_K8S_EPOCH_PREFIX in
  '') ;;
  0* | *[!0123456789]* | ??????????????*)
    dispatch_k8s_refuse "DISPATCH_K8S_EPOCH_PREFIX is not empty or a decimal of at most 13 digits without a leading zero" ;;
esac
# Visible ASCII, all 94 listed: one word on one log line, and yash, blind to
# what it cannot decode, agrees with the rest.
case ${DISPATCH_K8S_TOKEN_PREFIX-} in
  '') dispatch_k8s_refuse "DISPATCH_K8S_TOKEN_PREFIX is empty or not set" ;;
  *[!"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!\"#\$%&'()*+,-./:;<=>?@[\\]^_\`{|}~"]*)
    dispatch_k8s_refuse "DISPATCH_K8S_TOKEN_PREFIX holds a character that is not visible ASCII" ;;
esac
# A name starting with - would be an option of exec ("exec --" runs a command
# named -- in dash and posh).
case ${1-} in
  '') dispatch_k8s_refuse "no command to run" ;;
  -*) dispatch_k8s_refuse "the command name starts with -, which exec would read as an option" ;;
esac
# Every rule above held: the loop broke at the int64 edge, checked last, or
# else at the cd. "./" before a relative path: CDPATH is never searched (cd
# would print to stdout) and "-" is a directory, not OLDPWD.
case $DISPATCH_K8S_EDGE in
  1) dispatch_k8s_refuse "epoch $DISPATCH_EPOCH does not fit a signed 64-bit integer" ;;
esac
dispatch_k8s_refuse "cannot enter the directory named by DISPATCH_K8S_WORKDIR"
