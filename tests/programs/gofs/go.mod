module gofs
go 1.21
