#!/usr/bin/env bash
# Best-effort install of the Debian packages some features use:
#   wordnet-base  -> the sense study reads WordNet 3.0 from /usr/share/wordnet
#   chromium      -> the end-to-end explorer tests drive headless Chromium
#   strace        -> the durability test watches a real capture's mkdir / fsync / rename system calls
# Tests that need them skip with a message when they are missing.
# Arguments: the packages wanted (default: all three); `make demo` asks for wordnet-base alone, the browser and
# strace being the tests' (a fresh machine's first `make demo` does not wait for Chromium).
set -u
want=("$@")
[ ${#want[@]} -eq 0 ] && want=(wordnet-base chromium strace)
wanted() { local p; for p in "${want[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
need=()
wanted wordnet-base && { [ -d /usr/share/wordnet ] || need+=(wordnet-base); }
wanted chromium && { [ -x /usr/bin/chromium ] || need+=(chromium); }
wanted strace && { command -v strace >/dev/null || need+=(strace); }
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "system-deps: not root; install ${need[*]} yourself for the WordNet / browser / strace features" >&2; exit 0; fi
fi
if command -v apt-get >/dev/null; then
  $SUDO apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || echo "system-deps: could not install ${need[*]}; related tests will skip" >&2
else
  echo "system-deps: no apt-get; install ${need[*]} yourself for the WordNet / browser features" >&2
fi
exit 0
