# Makes .gpu/g0 .. .gpu/g2 (git-ignored, as .gpu/ is): the SmolLM2 GGUF (98.4 MB) cut to fill three calls, each beside
# the tree (25.7 MB in disk blocks on 2026-12-05f: the limit counts blocks, not bytes) under the 64 MiB a call
# carries: g0 20.0 MB (beside .gpu/fk, 20.1 MB), g1 40.0 MB, g2 the rest (38.4 MB) and an empty fourth part, so the
# bundles' install.sh joins the file in the call that carries g2. About 1 MB is left for the tree to grow.
# (h200-2026-12-04h/bundles.sh's four equal parts took five calls with .gpu/fk.) Needs ../shared/gpu/prepare.sh's
# .gpu/1 .. .gpu/3 first.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
name=SmolLM2-135M-Instruct.Q4_1.gguf
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat .gpu/[123]/$name.part0 .gpu/[123]/$name.part1 .gpu/[123]/$name.part2 .gpu/[123]/$name.part3 > "$tmp/$name"
echo "$(sha256sum "$tmp/$name" | cut -c1-16)… joined here (want b179c9523d0e6a0f)"
for n in 0 1 2; do rm -rf .gpu/g$n && mkdir -p .gpu/g$n && cp .gpu/1/install.sh .gpu/g$n/; done
cut() { dd if="$tmp/$name" of="$1" bs=1M iflag=skip_bytes,count_bytes skip="$2" ${3:+count=$3} status=none; }
cut .gpu/g0/$name.part0 0 20000000
cut .gpu/g1/$name.part1 20000000 40000000
cut .gpu/g2/$name.part2 60000000
: > .gpu/g2/$name.part3
cat .gpu/g0/$name.part0 .gpu/g1/$name.part1 .gpu/g2/$name.part2 | cmp - "$tmp/$name" && echo "the three parts join to it"
du -sb .gpu/g? | sed 's/^/bundle /'
