// Goroutines writing and reading back files at once in the directory given
// as argument; prints the number of entries it ends with. The cgo import
// links it against glibc, so that the preload shim is loaded into it: its
// system calls then run on goroutine stacks of a few kilobytes.
package main

// #include <stdlib.h>
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

func main() {
	dir := os.Args[1]
	const goroutines, files = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < files; i++ {
				p := filepath.Join(dir, fmt.Sprintf("g%d-%d", g, i))
				want := fmt.Sprintf("goroutine %d file %d\n", g, i)
				if err := os.WriteFile(p, []byte(want), 0o644); err != nil {
					errs <- err
					return
				}
				got, err := os.ReadFile(p)
				if err != nil {
					errs <- err
					return
				}
				if string(got) != want {
					errs <- fmt.Errorf("%s: got %q want %q", p, got, want)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		fmt.Fprintln(os.Stderr, e)
		os.Exit(1)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(len(ents))
}
