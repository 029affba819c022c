# Sourced by the scripts that make a side venv outside the checkout (vllm_cpu_env.sh, ray_env.sh, litellm_env.sh):
#
#   side_venv VENV WANT TAG NOTE
#
# makes VENV with $PYTHON once per WANT (what it must hold; a change rebuilds it, told by VENV/.fairserve-TAG), under
# a lock (two clones setting up at once), by the caller's own `install PYTHON` (NOTE is said first), then prints the
# venv's python.
side_venv() {
    local venv=$1 want=$2 stamp="$1/.fairserve-$3" note=$4
    mkdir -p "$(dirname "$venv")"
    exec 9>"$venv.lock"
    flock 9
    if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
        echo "$note" >&2
        [[ -x "$venv/bin/python" ]] || "${PYTHON:-python3}" -m venv "$venv"
        install "$venv/bin/python"
        echo "$want" >"$stamp"
    fi
    echo "$venv/bin/python"
}
