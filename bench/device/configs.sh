# Sourced by knobs.sh and trace.sh: a configuration is "label" (the defaults) or
# "label=VAR=value,VAR=value,..."; a setting BIN=<path> runs that binary (an earlier build
# copied into .device/bin) instead of .device/bin/attn, the others go to its environment.
label() { echo "${1%%=*}"; }
settings() { [[ $1 == *=* ]] && echo "${1#*=}" | tr ',' '\n' | grep -v '^BIN=' | tr '\n' ' '; }
binary() {
  local b=""
  [[ $1 == *=* ]] && b=$(echo "${1#*=}" | tr ',' '\n' | sed -n 's/^BIN=//p')
  echo "${b:-.device/bin/attn}"
}
