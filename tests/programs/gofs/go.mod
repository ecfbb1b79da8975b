module gofs

go 1.19
