# Sourced by scripts/setup.sh and scripts/setup-latest.sh: mamba-ssm's Triton kernels for the
# gpu-check tests (the `gpu-check` extra; see pyproject.toml and requirements-kernels.lock).

# install_kernels PIP...: mamba-ssm at its locked version and hash, built against the torch
# already installed, without its CUDA extension and without its dependencies.
install_kernels() {
  echo "installing mamba-ssm's Triton kernels (requirements-kernels.lock) ..."
  MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
    "$@" install --quiet --require-hashes --no-deps --no-build-isolation -r requirements-kernels.lock
}

# check_installed PIP...: pip check, but for the dependencies mamba-ssm declares and is
# installed without on purpose (tilelang, CUDA bindings, ...: its Triton kernels need none).
check_installed() {
  local report
  report=$("$@" check 2>&1) && return 0
  report=$(grep -v '^mamba-ssm ' <<< "$report" || true)
  if [ -n "$report" ]; then
    echo "$report" >&2
    return 1
  fi
}
