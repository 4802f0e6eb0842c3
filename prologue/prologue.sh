#!/bin/sh
# dispatch prologue: DISPATCH_K8S_* (A, J, epoch and token prefixes, workdir)
# in, DISPATCH_EPOCH and DISPATCH_ATTEMPT out, then exec of the command.
# Run as: /bin/sh -c "<this text>" dispatch-prologue CMD [ARG...]
# Exit: 125 refused (one "dispatch: " line on stderr, nothing run), else the
# command's own status (126/127 from the shell when it cannot be run).
# Built-ins only, no fork; no arithmetic before a value is matched as
# canonical decimal. Why each rule: docs/prologue.md. Every shell parses
# this whole text on every start, so comments here are kept short.
set -eu

dispatch_k8s_refuse() {
  echo "dispatch: $1" >&2
  exit 125
}

# A and J: "0", or 1 to 6 digits without a leading zero. Digits are listed,
# never a range (a range depends on the locale). A = 0 was never admitted.
case ${DISPATCH_K8S_ADMISSION-} in
  0) dispatch_k8s_refuse "DISPATCH_K8S_ADMISSION is 0: this execution was not admitted through dispatch" ;;
  '') dispatch_k8s_refuse "DISPATCH_K8S_ADMISSION is empty or not set" ;;
  0* | *[!0123456789]* | ???????*)
    dispatch_k8s_refuse "DISPATCH_K8S_ADMISSION is not 0 or a decimal of at most 6 digits without a leading zero"
    ;;
esac
case ${DISPATCH_K8S_RESTART-} in
  0) ;;
  '') dispatch_k8s_refuse "DISPATCH_K8S_RESTART is empty or not set" ;;
  0* | *[!0123456789]* | ???????*)
    dispatch_k8s_refuse "DISPATCH_K8S_RESTART is not 0 or a decimal of at most 6 digits without a leading zero"
    ;;
esac
DISPATCH_K8S_R=$((DISPATCH_K8S_ADMISSION + DISPATCH_K8S_RESTART))
case $DISPATCH_K8S_R in
  ???????) dispatch_k8s_refuse "R = A + J = $DISPATCH_K8S_R reached the bound 1000000" ;;
esac

# Set (yash takes a value it cannot decode for unset), and empty or 1 to 13
# digits without a leading zero; then R in six digits after it.
case ${DISPATCH_K8S_EPOCH_PREFIX+set} in
  '') dispatch_k8s_refuse "DISPATCH_K8S_EPOCH_PREFIX is not set (the packager sets it, to empty when G and N are 0)" ;;
esac
case $DISPATCH_K8S_EPOCH_PREFIX in
  '') DISPATCH_EPOCH=$DISPATCH_K8S_R ;;
  0* | *[!0123456789]* | ??????????????*)
    dispatch_k8s_refuse "DISPATCH_K8S_EPOCH_PREFIX is not empty or a decimal of at most 13 digits without a leading zero"
    ;;
  *)
    DISPATCH_EPOCH=$((DISPATCH_K8S_R + 1000000))
    DISPATCH_EPOCH=$DISPATCH_K8S_EPOCH_PREFIX${DISPATCH_EPOCH#1}
    ;;
esac

# At most 9223372036854775807 (int64): only a 13-digit prefix reaches it;
# numeric order is text order for equal lengths, so the prefix is compared
# digit by digit with 9223372036854 (mksh's integers are 32-bit).
case $DISPATCH_K8S_EPOCH_PREFIX in
  9223372036854)
    [ "$DISPATCH_K8S_R" -le 775807 ] ||
      dispatch_k8s_refuse "epoch $DISPATCH_EPOCH does not fit a signed 64-bit integer"
    ;;
  9[3456789]??????????? | 92[3456789]?????????? | 922[456789]????????? | \
    9223[456789]???????? | 92233[89]??????? | 922337[3456789]?????? | \
    9223372[123456789]????? | 92233720[456789]???? | 922337203[789]??? | \
    9223372036[9]?? | 92233720368[6789]? | 922337203685[56789])
    dispatch_k8s_refuse "epoch $DISPATCH_EPOCH does not fit a signed 64-bit integer"
    ;;
esac

# Visible ASCII, all 94 listed: one word on one log line, and yash, blind to
# what it cannot decode, agrees with the rest.
case ${DISPATCH_K8S_TOKEN_PREFIX-} in
  '') dispatch_k8s_refuse "DISPATCH_K8S_TOKEN_PREFIX is empty or not set" ;;
  *[!"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!\"#\$%&'()*+,-./:;<=>?@[\\]^_\`{|}~"]*)
    dispatch_k8s_refuse "DISPATCH_K8S_TOKEN_PREFIX holds a character that is not visible ASCII"
    ;;
esac

# A name starting with - would be an option of exec (and "exec --" runs a
# command named -- in dash and posh).
case ${1-} in
  '') dispatch_k8s_refuse "no command to run" ;;
  -*) dispatch_k8s_refuse "the command name starts with -, which exec would read as an option" ;;
esac

# "./" before a relative path: CDPATH is never searched (cd would print to
# stdout) and "-" is a directory, not OLDPWD.
case ${DISPATCH_K8S_WORKDIR-} in
  '') ;;
  /*) cd "$DISPATCH_K8S_WORKDIR" 2>/dev/null ||
    dispatch_k8s_refuse "cannot enter the directory named by DISPATCH_K8S_WORKDIR" ;;
  *) cd "./$DISPATCH_K8S_WORKDIR" 2>/dev/null ||
    dispatch_k8s_refuse "cannot enter the directory named by DISPATCH_K8S_WORKDIR" ;;
esac

export DISPATCH_EPOCH "DISPATCH_ATTEMPT=$DISPATCH_K8S_TOKEN_PREFIX.$DISPATCH_K8S_ADMISSION.$DISPATCH_K8S_RESTART"
unset DISPATCH_K8S_ADMISSION DISPATCH_K8S_RESTART DISPATCH_K8S_EPOCH_PREFIX \
  DISPATCH_K8S_TOKEN_PREFIX DISPATCH_K8S_WORKDIR DISPATCH_K8S_R
exec "$@"
