// Command dlq-consumer indexes dead letters, schedules their retries and
// serves the admin API and console.
package main

import (
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/service"
)

func main() { daemon.Main("dlq-consumer", service.RunDLQ) }
