# Makes .gpu/m0 .. .gpu/m3 (git-ignored, as .gpu/ is): one SmolLM2 GGUF part each with the bundles' install.sh, so each
# travels beside the 18.5 MB tree in one call (two parts, 49.2 MB, do not fit 64 MiB). Needs ../shared/gpu/prepare.sh's
# .gpu/1 .. .gpu/3 first. The fourth part's install joins the GGUF (install.sh does, once all four are in /opt/models).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for n in 0 1 2 3; do
  part=$(ls .gpu/[123]/SmolLM2-135M-Instruct.Q4_1.gguf.part$n)
  rm -rf .gpu/m$n && mkdir -p .gpu/m$n && cp "$part" .gpu/1/install.sh .gpu/m$n/
done
du -sh .gpu/m? | sed 's/^/bundle /'
