// Command gen writes the configuration reference, docs/config.md, from
// internal/config's schema (make config-docs). Run it from anywhere in the
// module: it finds the module's root by its go.mod.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kfpipe/kfpipe/internal/config"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "config-docs:", err)
		os.Exit(1)
	}
}

func run() error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	out, err := config.Reference(root)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, config.ReferencePath), out, 0o644)
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
