// Command kf-producer answers the WeChat callback, pulls messages with
// sync_msg and produces them to Kafka, advancing the cursor only after
// delivery.
package main

import (
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/service"
)

func main() { daemon.Main("kf-producer", service.RunProducer) }
