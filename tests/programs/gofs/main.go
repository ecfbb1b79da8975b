package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// #include <stdlib.h>
import "C"

func main() {
	dir := os.Args[1]
	n := 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				p := filepath.Join(dir, fmt.Sprintf("g%d-%d", g, i))
				want := []byte(fmt.Sprintf("goroutine %d file %d\n", g, i))
				if err := os.WriteFile(p, want, 0o644); err != nil {
					errs <- err
					return
				}
				got, err := os.ReadFile(p)
				if err != nil {
					errs <- err
					return
				}
				if string(got) != string(want) {
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
