package main

import (
	"bytes"
	"flag"
	"log"
	"os"
)

func main() {
	asmPath := flag.String("asm", "kernels_amd64.s", "assembly output")
	goPath := flag.String("go", "kernels_amd64.go", "Go declarations output")
	flag.Parse()
	var asm, decl bytes.Buffer
	generate(&asm, &decl)
	if err := os.WriteFile(*asmPath, asm.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*goPath, decl.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
}
