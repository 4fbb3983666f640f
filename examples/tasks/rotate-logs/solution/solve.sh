#!/usr/bin/env bash
# Reference solution of rotate-logs (cwd /app).
set -euo pipefail
cat > rotate.sh <<'SH'
#!/usr/bin/env bash
# rotate.sh DIR KEEP: keep the KEEP newest *.log files in DIR, move the others into DIR/archive/.
set -euo pipefail

usage() { echo "usage: rotate.sh DIR KEEP (KEEP a whole number, 0 or more)" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
dir=$1 keep=$2
[[ $keep =~ ^[0-9]+$ ]] || usage
[[ -d $dir ]] || { echo "rotate.sh: $dir: not a directory" >&2; exit 1; }

# Newest first: "<mtime> <path>" records, NUL-terminated so any name survives.
mapfile -d '' logs < <(find "$dir" -mindepth 1 -maxdepth 1 -type f -name '*.log' -printf '%T@ %p\0' | sort -z -rn)
(( ${#logs[@]} > keep )) || exit 0
mkdir -p "$dir/archive"
for (( i = ${#logs[@]} - 1; i >= keep; i-- )); do
    path=${logs[i]#* }
    mv -f -- "$path" "$dir/archive/"
    echo "archived ${path##*/}"
done
SH
chmod 755 rotate.sh
