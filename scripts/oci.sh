# Packing OCI image archives with Debian's umoci, reproducibly. Source it
# after lib.sh; needs umoci, jq and GNU tar. scripts/install-node's RECIPE
# must be bumped when this changes (its stamp does not hash this file).

# oci_image NAME:TAG ROOTFS ARCHIVE CONFIG...: packs ROOTFS as a one-layer image
# with umoci, every timestamp and owner fixed, so the same files give the same
# digest; the archive is the OCI layout, tarred the same way.
oci_image() {
	local ref=$1 rootfs=$2 archive=$3
	shift 3
	local work layout tag=${ref##*:}
	work=$(mktemp -d)
	layout="$work/layout"
	# The image's / (a mktemp directory is 0700: a non-root user could not
	# reach its binary).
	chmod 0755 "$rootfs"
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
		--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
		-C "$rootfs" -cf "$work/layer.tar" . || die "packing $rootfs" "see tar's error above"
	umoci init --layout "$layout" &&
		umoci new --image "$layout:$tag" &&
		umoci raw add-layer --image "$layout:$tag" --history.created=1970-01-01T00:00:00Z --history.created_by="graceguard: the image's files" "$work/layer.tar" &&
		umoci config --image "$layout:$tag" --no-history --created=1970-01-01T00:00:00Z \
			--os=linux --architecture=amd64 --author=graceguard "$@" &&
		umoci gc --layout "$layout" || die "packing $ref with umoci" "see umoci's error above"
	# containerd names an imported image by this annotation (the OCI one holds the tag alone).
	jq -c --arg ref "$ref" '.manifests[0].annotations["io.containerd.image.name"] = $ref' \
		"$layout/index.json" >"$work/index.json" && mv "$work/index.json" "$layout/index.json"
	find "$layout" -exec touch -h -d @0 {} +
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
		--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
		-C "$layout" -cf "$archive.tmp" . && mv "$archive.tmp" "$archive" || die "writing $archive" "see tar's error above"
	rm -rf "$work"
}
