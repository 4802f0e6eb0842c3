#!/bin/sh
# dispatch prologue: DISPATCH_K8S_* in, DISPATCH_EPOCH and DISPATCH_ATTEMPT
# out, then exec of the command; exit 125 and one "dispatch: " line when
# refused. Built-ins only, no fork. Why each rule: the notes at the end
# (after the exec, so the shell never parses them on the way to the command)
# and docs/prologue.md.
set -eu
while :; do
  case ${DISPATCH_K8S_ADMISSION-} in
    0) dispatch_k8s_why=A0; break ;;
    '') dispatch_k8s_why=A-; break ;;
    0* | *[!0123456789]* | ???????*) dispatch_k8s_why=A; break ;;
  esac
  case ${DISPATCH_K8S_RESTART-} in
    0) ;;
    '') dispatch_k8s_why=J-; break ;;
    0* | *[!0123456789]* | ???????*) dispatch_k8s_why=J; break ;;
  esac
  DISPATCH_K8S_R=$((DISPATCH_K8S_ADMISSION + DISPATCH_K8S_RESTART))
  case $DISPATCH_K8S_R in
    ???????) dispatch_k8s_why=R; break ;;
  esac
  case ${DISPATCH_K8S_EPOCH_PREFIX+set} in
    '') dispatch_k8s_why=P-; break ;;
  esac
  case $DISPATCH_K8S_EPOCH_PREFIX in
    '') DISPATCH_EPOCH=$DISPATCH_K8S_R ;;
    0* | *[!0123456789]* | ??????????????*) dispatch_k8s_why=P; break ;;
    *)
      DISPATCH_EPOCH=$((DISPATCH_K8S_R + 1000000))
      DISPATCH_EPOCH=$DISPATCH_K8S_EPOCH_PREFIX${DISPATCH_EPOCH#1}
      ;;
  esac
  case $DISPATCH_K8S_EPOCH_PREFIX in
    9223372036854) [ "$DISPATCH_K8S_R" -le 775807 ] || { dispatch_k8s_why=E; break; } ;;
    9[3456789]??????????? | 92[3456789]?????????? | 922[456789]????????? | \
      9223[456789]???????? | 92233[89]??????? | 922337[3456789]?????? | \
      9223372[123456789]????? | 92233720[456789]???? | 922337203[789]??? | \
      9223372036[9]?? | 92233720368[6789]? | 922337203685[56789])
      dispatch_k8s_why=E; break ;;
  esac
  case ${DISPATCH_K8S_TOKEN_PREFIX-} in
    '') dispatch_k8s_why=T-; break ;;
    *[!"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!\"#\$%&'()*+,-./:;<=>?@[\\]^_\`{|}~"]*)
      dispatch_k8s_why=T; break ;;
  esac
  case ${1-} in
    '') dispatch_k8s_why=C-; break ;;
    -*) dispatch_k8s_why=C; break ;;
  esac
  case ${DISPATCH_K8S_WORKDIR-} in
    '') ;;
    /*) cd "$DISPATCH_K8S_WORKDIR" 2>/dev/null || { dispatch_k8s_why=W; break; } ;;
    *) cd "./$DISPATCH_K8S_WORKDIR" 2>/dev/null || { dispatch_k8s_why=W; break; } ;;
  esac
  export DISPATCH_EPOCH "DISPATCH_ATTEMPT=$DISPATCH_K8S_TOKEN_PREFIX.$DISPATCH_K8S_ADMISSION.$DISPATCH_K8S_RESTART"
  unset DISPATCH_K8S_ADMISSION DISPATCH_K8S_RESTART DISPATCH_K8S_EPOCH_PREFIX \
    DISPATCH_K8S_TOKEN_PREFIX DISPATCH_K8S_WORKDIR DISPATCH_K8S_R
  # shellcheck disable=SC2093 # exec does not return: a failed one exits the shell (126/127)
  exec "$@"
done

# Refused: only here is the text below parsed. One line, nothing run.
case $dispatch_k8s_why in
  # A = 0: never admitted through dispatch, and its R could repeat a later one's.
  A0) echo "dispatch: DISPATCH_K8S_ADMISSION is 0: this execution was not admitted through dispatch" ;;
  A-) echo "dispatch: DISPATCH_K8S_ADMISSION is empty or not set" ;;
  # "0", or 1 to 6 digits without a leading zero; digits are listed, never a
  # range (a range depends on the locale). Shells disagree on 010 (octal or
  # decimal) and wrap on overflow, so no arithmetic runs before this match.
  A) echo "dispatch: DISPATCH_K8S_ADMISSION is not 0 or a decimal of at most 6 digits without a leading zero" ;;
  J-) echo "dispatch: DISPATCH_K8S_RESTART is empty or not set" ;;
  J) echo "dispatch: DISPATCH_K8S_RESTART is not 0 or a decimal of at most 6 digits without a leading zero" ;;
  R) echo "dispatch: R = A + J = $DISPATCH_K8S_R reached the bound 1000000" ;;
  # Set (yash takes a value it cannot decode for unset), and empty or 1 to 13
  # digits without a leading zero; R follows it in six digits.
  P-) echo "dispatch: DISPATCH_K8S_EPOCH_PREFIX is not set (the packager sets it, to empty when G and N are 0)" ;;
  P) echo "dispatch: DISPATCH_K8S_EPOCH_PREFIX is not empty or a decimal of at most 13 digits without a leading zero" ;;
  # At most 9223372036854775807 (int64): only a 13-digit prefix reaches it; for
  # equal lengths numeric order is text order, so the prefix is compared digit
  # by digit with 9223372036854 (mksh's integers are 32-bit).
  E) echo "dispatch: epoch $DISPATCH_EPOCH does not fit a signed 64-bit integer" ;;
  T-) echo "dispatch: DISPATCH_K8S_TOKEN_PREFIX is empty or not set" ;;
  # Visible ASCII, all 94 listed: one word on one log line, and yash, blind to
  # what it cannot decode, agrees with the rest.
  T) echo "dispatch: DISPATCH_K8S_TOKEN_PREFIX holds a character that is not visible ASCII" ;;
  C-) echo "dispatch: no command to run" ;;
  # A name starting with - would be an option of exec ("exec --" runs a
  # command named -- in dash and posh).
  C) echo "dispatch: the command name starts with -, which exec would read as an option" ;;
  # "./" before a relative path: CDPATH is never searched (cd would print to
  # stdout) and "-" is a directory, not OLDPWD.
  W) echo "dispatch: cannot enter the directory named by DISPATCH_K8S_WORKDIR" ;;
esac >&2
exit 125
