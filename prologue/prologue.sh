#!/bin/sh
# dispatch prologue: turns the Downward API values into DISPATCH_EPOCH and
# DISPATCH_ATTEMPT, then execs the user's command (it keeps this PID).
#
# Run as: /bin/sh -c "<this file's text>" dispatch-prologue CMD [ARG...]
# Inputs: DISPATCH_K8S_ADMISSION (A), DISPATCH_K8S_RESTART (J),
#         DISPATCH_K8S_EPOCH_PREFIX, DISPATCH_K8S_TOKEN_PREFIX,
#         DISPATCH_K8S_WORKDIR (optional).
# Exit status: 125 refused (one "dispatch: ..." line on stderr, nothing run);
#   otherwise the command's own (126/127 from the shell if it cannot be run).
#
# Rules kept here (see docs/prologue.md for why each exists):
# - Shell built-ins only and no fork, not even a command substitution.
# - No arithmetic touches a value before it is matched as canonical decimal:
#   shells disagree on leading zeros (octal or not) and wrap on overflow.
# - A refusal never echoes a value that was not validated as digits, so the
#   message stays one line and no echo escape is ever interpreted.
# - yash does not import a variable whose bytes are not text in the locale
#   (any non-ASCII byte in the C locale): to yash it is unset. So an unset
#   epoch prefix is refused (yash would take a malformed one for the empty
#   prefix, a wrong epoch), and the token prefix must be visible ASCII
#   (yash would refuse what the others accept).
# - Internal variables are named DISPATCH_K8S_*: that namespace is reserved
#   and unset before the exec, so the user's environment is left untouched.
set -eu

dispatch_k8s_refuse() {
  echo "dispatch: $1" >&2
  exit 125
}

# A and J: "0", or 1 to 6 digits with no leading zero.
dispatch_k8s_count() {
  case $2 in
    0 | [123456789] | [123456789][0123456789] | \
      [123456789][0123456789][0123456789] | \
      [123456789][0123456789][0123456789][0123456789] | \
      [123456789][0123456789][0123456789][0123456789][0123456789] | \
      [123456789][0123456789][0123456789][0123456789][0123456789][0123456789]) ;;
    '') dispatch_k8s_refuse "$1 is empty or not set" ;;
    *) dispatch_k8s_refuse "$1 is not 0 or a decimal of at most 6 digits without a leading zero" ;;
  esac
}

dispatch_k8s_count DISPATCH_K8S_ADMISSION "${DISPATCH_K8S_ADMISSION-}"
dispatch_k8s_count DISPATCH_K8S_RESTART "${DISPATCH_K8S_RESTART-}"
if [ "$DISPATCH_K8S_ADMISSION" = 0 ]; then
  dispatch_k8s_refuse "DISPATCH_K8S_ADMISSION is 0: this execution was not admitted through dispatch"
fi

# Both are now at most 999999, so the sum fits every shell's integers
# (mksh's are 32-bit).
DISPATCH_K8S_R=$((DISPATCH_K8S_ADMISSION + DISPATCH_K8S_RESTART))
if [ "$DISPATCH_K8S_R" -ge 1000000 ]; then
  dispatch_k8s_refuse "R = A + J = $DISPATCH_K8S_R reached the bound 1000000"
fi

# The epoch prefix is the decimal of G*10^6 + N: set, and empty or 1 to 13
# digits with no leading zero. It is never used in arithmetic.
if [ -z "${DISPATCH_K8S_EPOCH_PREFIX+set}" ]; then
  dispatch_k8s_refuse "DISPATCH_K8S_EPOCH_PREFIX is not set (the packager sets it, to empty when G and N are 0)"
fi
case $DISPATCH_K8S_EPOCH_PREFIX in
  '') DISPATCH_K8S_E=$DISPATCH_K8S_R ;;
  [123456789] | [123456789][0123456789] | \
    [123456789][0123456789][0123456789] | \
    [123456789][0123456789][0123456789][0123456789] | \
    [123456789][0123456789][0123456789][0123456789][0123456789] | \
    [123456789][0123456789][0123456789][0123456789][0123456789][0123456789] | \
    [123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789] | \
    [123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789] | \
    [123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789] | \
    [123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789] | \
    [123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789] | \
    [123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789] | \
    [123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789][0123456789])
    # R padded to six digits by its length; printf would not be a
    # built-in in every shell (posh) and $(...) would fork.
    case $DISPATCH_K8S_R in
      ?????) DISPATCH_K8S_E=${DISPATCH_K8S_EPOCH_PREFIX}0$DISPATCH_K8S_R ;;
      ????) DISPATCH_K8S_E=${DISPATCH_K8S_EPOCH_PREFIX}00$DISPATCH_K8S_R ;;
      ???) DISPATCH_K8S_E=${DISPATCH_K8S_EPOCH_PREFIX}000$DISPATCH_K8S_R ;;
      ??) DISPATCH_K8S_E=${DISPATCH_K8S_EPOCH_PREFIX}0000$DISPATCH_K8S_R ;;
      ?) DISPATCH_K8S_E=${DISPATCH_K8S_EPOCH_PREFIX}00000$DISPATCH_K8S_R ;;
      *) DISPATCH_K8S_E=$DISPATCH_K8S_EPOCH_PREFIX$DISPATCH_K8S_R ;;
    esac
    ;;
  *) dispatch_k8s_refuse "DISPATCH_K8S_EPOCH_PREFIX is not empty or a decimal of at most 13 digits without a leading zero" ;;
esac

# The epoch must fit a signed 64-bit integer: 9223372 036854 775807 as
# (G, N, R). Only a 13-digit prefix can reach it; its G (7 digits) and N
# (6 digits, leading zeros stripped first) each fit 32-bit arithmetic.
case $DISPATCH_K8S_EPOCH_PREFIX in
  ?????????????)
    DISPATCH_K8S_G=${DISPATCH_K8S_EPOCH_PREFIX%??????}
    DISPATCH_K8S_N=${DISPATCH_K8S_EPOCH_PREFIX#"$DISPATCH_K8S_G"}
    while :; do
      case $DISPATCH_K8S_N in
        0?*) DISPATCH_K8S_N=${DISPATCH_K8S_N#0} ;;
        *) break ;;
      esac
    done
    if [ "$DISPATCH_K8S_G" -gt 9223372 ] || {
      [ "$DISPATCH_K8S_G" -eq 9223372 ] && {
        [ "$DISPATCH_K8S_N" -gt 36854 ] || {
          [ "$DISPATCH_K8S_N" -eq 36854 ] && [ "$DISPATCH_K8S_R" -gt 775807 ]
        }
      }
    }; then
      dispatch_k8s_refuse "epoch $DISPATCH_K8S_E does not fit a signed 64-bit integer"
    fi
    ;;
esac

# The token prefix is <JobID>.<N>.<attempt>: visible ASCII only (as the
# toolkit makes it), so the attempt token is one word on one log line, and
# so that yash, which cannot see a non-ASCII value, agrees with the rest.
# Every visible ASCII character, listed: a range would depend on the locale.
DISPATCH_K8S_V='0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!"#$%&'\''()*+,-./:;<=>?@[\]^_`{|}~'
case ${DISPATCH_K8S_TOKEN_PREFIX-} in
  '') dispatch_k8s_refuse "DISPATCH_K8S_TOKEN_PREFIX is empty or not set" ;;
  *[!"$DISPATCH_K8S_V"]*) dispatch_k8s_refuse "DISPATCH_K8S_TOKEN_PREFIX holds a character that is not visible ASCII" ;;
esac

if [ "$#" -eq 0 ] || [ -z "$1" ]; then
  dispatch_k8s_refuse "no command to run"
fi
# exec would read such a name as its own option: bash, yash and ksh93 then
# exit 0 having run nothing, mksh crashes, busybox and zsh exit 1 or 2.
# "exec --" is no way out: dash and posh run a command named "--".
case $1 in
  -*) dispatch_k8s_refuse "the command name starts with -, which exec would read as an option" ;;
esac

if [ -n "${DISPATCH_K8S_WORKDIR-}" ]; then
  # A relative path gets "./" so that CDPATH is never searched (cd would
  # print the directory on stdout) and "-" is not OLDPWD.
  case $DISPATCH_K8S_WORKDIR in
    /*) ;;
    *) DISPATCH_K8S_WORKDIR=./$DISPATCH_K8S_WORKDIR ;;
  esac
  cd "$DISPATCH_K8S_WORKDIR" 2>/dev/null ||
    dispatch_k8s_refuse "cannot enter the directory named by DISPATCH_K8S_WORKDIR"
fi

DISPATCH_EPOCH=$DISPATCH_K8S_E
DISPATCH_ATTEMPT=$DISPATCH_K8S_TOKEN_PREFIX.$DISPATCH_K8S_ADMISSION.$DISPATCH_K8S_RESTART
export DISPATCH_EPOCH DISPATCH_ATTEMPT
unset DISPATCH_K8S_ADMISSION DISPATCH_K8S_RESTART DISPATCH_K8S_EPOCH_PREFIX \
  DISPATCH_K8S_TOKEN_PREFIX DISPATCH_K8S_WORKDIR \
  DISPATCH_K8S_R DISPATCH_K8S_E DISPATCH_K8S_G DISPATCH_K8S_N DISPATCH_K8S_V
unset -f dispatch_k8s_refuse dispatch_k8s_count
exec "$@"
