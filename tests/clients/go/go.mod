module github.com/graceguard/graceguard/tests/clients/go

go 1.19
