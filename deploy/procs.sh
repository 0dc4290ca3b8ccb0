# deploy/procs.sh: what pagoda-down and pagoda-status (which source it) read of a process.
# Builtins only: both scan every process's name, and a fork or three each (tr, head, basename)
# made a scan of 70 processes take over a second.

# The name of a process (argv[0]'s base name) into $name, nothing when it is gone.
name_of() { # pid
    local a=
    IFS= read -r -d '' a 2>/dev/null <"/proc/$1/cmdline" || true
    name=${a##*/}
}

# The same, printed.
proc_name() { # pid
    local name
    name_of "$1"
    [ -z "$name" ] || printf '%s\n' "$name"
}
