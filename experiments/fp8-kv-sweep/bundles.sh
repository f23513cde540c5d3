# Makes .gpu/g0 .. .gpu/g3 (git-ignored, as .gpu/ is): the SmolLM2 GGUF (98.4 MB) cut to fill four calls, each beside
# the tree under the 64 MiB a call carries, counted in disk blocks (28.3 MB of blocks for 24.9 MB of bytes on
# 2026-12-06c; 25.7 MB on 2026-12-05f, when three parts fit): g0 16.0 MB (beside .gpu/fk, 20.1 MB: 2.5 MB left for
# the tree to grow), g1 and g2 38.0 MB, g3 the rest (6.4 MB), so the bundles' install.sh joins the file in the call
# that carries the last of them.
# (h200-2026-12-04h/bundles.sh's four equal parts took five calls with .gpu/fk.) Needs ../shared/gpu/prepare.sh's
# .gpu/1 .. .gpu/3 first.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
name=SmolLM2-135M-Instruct.Q4_1.gguf
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat .gpu/[123]/$name.part0 .gpu/[123]/$name.part1 .gpu/[123]/$name.part2 .gpu/[123]/$name.part3 > "$tmp/$name"
echo "$(sha256sum "$tmp/$name" | cut -c1-16)… joined here (want b179c9523d0e6a0f)"
for n in 0 1 2 3; do rm -rf .gpu/g$n && mkdir -p .gpu/g$n && cp .gpu/1/install.sh .gpu/g$n/; done
cut() { dd if="$tmp/$name" of="$1" bs=1M iflag=skip_bytes,count_bytes skip="$2" ${3:+count=$3} status=none; }
cut .gpu/g0/$name.part0 0 16000000
cut .gpu/g1/$name.part1 16000000 38000000
cut .gpu/g2/$name.part2 54000000 38000000
cut .gpu/g3/$name.part3 92000000
cat .gpu/g?/$name.part? | cmp - "$tmp/$name" && echo "the four parts join to it"
du -sb .gpu/g? | sed 's/^/bundle /'
