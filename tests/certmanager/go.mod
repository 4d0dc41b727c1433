// cert-manager's CustomResourceDefinitions (deploy/crds of its module), for
// graceguard's certManager-mode test (scripts/install-helm copies them into
// a cache). Only the module's files are read; nothing of it is built.
module graceguard.dev/testbed/certmanager

go 1.26.6

require github.com/cert-manager/cert-manager v1.21.2
