module github.com/graceguard/graceguard/clients/go

go 1.21
