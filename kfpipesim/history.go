package kfpipesim

import "github.com/kfpipe/kfpipe"

// historyTurns is how many turns of each conversation the simulator keeps
// for kfpipe.History when it runs with no archive.
const historyTurns = 200

// historyOptions: kfpipe.History is served from memory, unless the
// configuration names an archive (archive.dsn), which it then reads as the
// consumer does.
func historyOptions(cfg *kfpipe.Config) []kfpipe.ConsumerOption {
	if cfg.Archive.DSN != "" {
		return nil
	}
	return []kfpipe.ConsumerOption{kfpipe.WithMemoryHistory(historyTurns)}
}
