package service

import (
	"fmt"
	"os"
)

// nodeName identifies this process in dead letters and lock owners.
func nodeName() string {
	h, err := os.Hostname()
	if err != nil {
		h = "unknown"
	}
	return fmt.Sprintf("%s/%d", h, os.Getpid())
}
