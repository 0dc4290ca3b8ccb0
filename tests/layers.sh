#!/usr/bin/env bash
# Which module may include which (README's table; STYLE.md: a folder is a module): the rules
# that keep the model library shared by every process and the worker's house in order.
# Usage: layers.sh SOURCE_DIR
set -uo pipefail
cd "${1:?usage: layers.sh SOURCE_DIR}" || exit 1
# shellcheck source=tests/check.sh
. tests/check.sh

# only_includes DIR ALLOWED: every "dir/..." header that DIR's sources include is from a folder
# matching the extended regex ALLOWED, and DIR has sources at all.
only_includes() {
    local dir=$1 allowed=$2 bad
    compgen -G "$dir/*.[ch]" >/dev/null || { echo "  $dir/ has no sources"; return 1; }
    bad=$(grep -HnE '^#include "[a-z_]+/' "$dir"/*.[ch] | grep -vE "#include \"($allowed)/")
    [ -z "$bad" ] || { printf '  %s\n' "$bad"; return 1; }
}

# never_includes DIR FOLDER: DIR's sources include no header of FOLDER.
never_includes() {
    local bad
    bad=$(grep -HnE "^#include \"$2/" "$1"/*.[ch])
    [ -z "$bad" ] || { printf '  %s\n' "$bad"; return 1; }
}

# model/ is read by the worker, kvpool, the tools and the benchmarks: it needs common/ only.
check "model/ includes common/ only" only_includes model 'common|model'
# kvpool/ serves every process its pool: it reads models through model/, never worker/.
check "kvpool/ does not include worker/" never_includes kvpool worker
# The exit status a worker gives the supervisor is shared through common/exit_status.h, so
# neither side includes the other.
check "worker/ does not include deploy/" never_includes worker deploy
check "deploy/ does not include worker/" never_includes deploy worker
check_summary
