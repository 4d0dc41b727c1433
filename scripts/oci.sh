# Packing OCI image archives with Debian's umoci, reproducibly. Source it
# after lib.sh; needs umoci, jq, sha256sum and GNU tar. scripts/install-node's
# RECIPE must be bumped when this changes what oci_image writes (its stamp
# does not hash this file).

# The tar options that make an archive depend on its files alone.
_oci_tar() {
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
		--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime "$@"
}

# _oci_add LAYOUT TAG ROOTFS ARCH CONFIG...: one image of ROOTFS as one layer
# for linux/ARCH, tagged TAG in LAYOUT, every timestamp and owner fixed.
_oci_add() {
	local layout=$1 tag=$2 rootfs=$3 arch=$4 layer
	shift 4
	layer=$(mktemp)
	# The image's / (a mktemp directory is 0700: a non-root user could not
	# reach its binary).
	chmod 0755 "$rootfs"
	_oci_tar -C "$rootfs" -cf "$layer" . || die "packing $rootfs" "see tar's error above"
	umoci new --image "$layout:$tag" &&
		umoci raw add-layer --image "$layout:$tag" --history.created=1970-01-01T00:00:00Z --history.created_by="graceguard: the image's files" "$layer" &&
		umoci config --image "$layout:$tag" --no-history --created=1970-01-01T00:00:00Z \
			--os=linux --architecture="$arch" --author=graceguard "$@" &&
		umoci gc --layout "$layout" || die "packing $tag for linux/$arch with umoci" "see umoci's error above"
	rm -f "$layer"
}

# _oci_finish LAYOUT NAME:TAG ARCHIVE: names the layout's one entry for
# containerd and tars the layout.
_oci_finish() {
	local layout=$1 ref=$2 archive=$3
	# containerd names an imported image by this annotation (the OCI one holds the tag alone).
	jq -c --arg ref "$ref" '.manifests[0].annotations["io.containerd.image.name"] = $ref' \
		"$layout/index.json" >"$layout/index.json.tmp" && mv "$layout/index.json.tmp" "$layout/index.json"
	find "$layout" -exec touch -h -d @0 {} +
	_oci_tar -C "$layout" -cf "$archive.tmp" . && mv "$archive.tmp" "$archive" || die "writing $archive" "see tar's error above"
}

# oci_image NAME:TAG ROOTFS ARCHIVE CONFIG...: packs ROOTFS as a one-layer
# linux/amd64 image with umoci, so the same files give the same digest; the
# archive is the OCI layout, tarred the same way.
oci_image() {
	local ref=$1 rootfs=$2 archive=$3
	shift 3
	local work
	work=$(mktemp -d)
	umoci init --layout "$work/layout" || die "packing $ref with umoci" "see umoci's error above"
	_oci_add "$work/layout" "${ref##*:}" "$rootfs" amd64 "$@"
	_oci_finish "$work/layout" "$ref" "$archive"
	rm -rf "$work"
}

# oci_index NAME:TAG ARCHIVE ARCH=ROOTFS... -- CONFIG...: one image per
# ARCH (each ROOTFS as one layer, the same CONFIG), under one OCI image index
# whose entries name their platform, so a runtime pulls its own. The layout's
# one entry is the index, tagged TAG; the same files give the same digests.
oci_index() {
	local ref=$1 archive=$2 tag=${1##*:}
	shift 2
	local pairs=() work layout arch rootfs entries index digest
	while [ $# -gt 0 ] && [ "$1" != -- ]; do pairs+=("$1"); shift; done
	[ "${1:-}" = -- ] && shift
	work=$(mktemp -d)
	layout="$work/layout"
	umoci init --layout "$layout" || die "packing $ref with umoci" "see umoci's error above"
	for pair in "${pairs[@]}"; do
		arch=${pair%%=*} rootfs=${pair#*=}
		_oci_add "$layout" "$tag-$arch" "$rootfs" "$arch" "$@"
	done
	entries=$(for pair in "${pairs[@]}"; do
		arch=${pair%%=*}
		jq -c --arg t "$tag-$arch" --arg a "$arch" '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $t)
			| {mediaType, digest, size, platform: {architecture: $a, os: "linux"}}' "$layout/index.json"
	done | jq -cs .)
	index=$(jq -cn --argjson m "$entries" '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: $m}')
	printf '%s' "$index" >"$work/index.blob"
	digest=$(sha256sum "$work/index.blob" | cut -d' ' -f1)
	mv "$work/index.blob" "$layout/blobs/sha256/$digest"
	jq -cn --arg d "sha256:$digest" --argjson s "$(stat -c %s "$layout/blobs/sha256/$digest")" --arg t "$tag" \
		'{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: [{mediaType: "application/vnd.oci.image.index.v1+json", digest: $d, size: $s, annotations: {"org.opencontainers.image.ref.name": $t}}]}' \
		>"$layout/index.json"
	_oci_finish "$layout" "$ref" "$archive"
	rm -rf "$work"
}
