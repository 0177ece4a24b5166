package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kfpipe/kfpipe/internal/console"
)

func (a *app) fleetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "fleet",
		Short: "The running daemons, as registered in etcd (coord.enabled)",
		Long: `The running daemons, as registered in etcd (coord.enabled). A daemon whose
registration lapsed (killed, or cut off from etcd) is listed as stale, with when
it was last heard from, and is dropped 5 minutes after that; kfpipectl health and
the console's consumers table follow the same rule for the consumers' reports.`,
		Args: args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var f console.FleetList
			if printed, err := a.read(cmd, "/admin/fleet", nil, &f); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ROLE\tINSTANCE\tNODE\tVERSION\tUP\tOPS\tWORKS ON")
			for _, m := range f.Members {
				up := time.Since(m.StartedAt).Round(time.Second).String()
				if m.LastHeard != nil {
					up = "silent " + time.Since(*m.LastHeard).Round(time.Second).String()
					if m.Stale {
						up += " (stale)"
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Role, m.ID, m.Node, m.Version,
					up, m.OpsAddr, worksOn(m.Role, m.WorkerID, m.Partitions, m.Actors, m.AdminAddr))
			}
			return tw.Flush()
		},
	}
}

// worksOn says what a fleet member works on, as the console does.
func worksOn(role string, workerID int, partitions []int32, actors int, adminAddr string) string {
	switch role {
	case "kf-producer":
		if workerID < 0 {
			return "no worker ID"
		}
		return "worker ID " + strconv.Itoa(workerID)
	case "schedule-consumer":
		ps := make([]string, len(partitions))
		for i, p := range partitions {
			ps[i] = strconv.Itoa(int(p))
		}
		return fmt.Sprintf("partitions %s; %d actors", orDash(strings.Join(ps, ",")), actors)
	case "dlq-consumer":
		return "admin " + orDash(adminAddr)
	}
	return "-"
}

func (a *app) rlRules() *cobra.Command {
	return &cobra.Command{
		Use:   "rules",
		Short: "The group rules in force and their version (for set-rules)",
		Args:  args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var r console.RateRules
			if printed, err := a.read(cmd, "/admin/ratelimit/rules", nil, &r); printed || err != nil {
				return err
			}
			fmt.Fprintf(a.out, "version %d (backend %s)\n", r.Version, r.Backend)
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "GROUP\tWINDOW\tMAX\tPENALTY AFTER\tBLOCK")
			for _, n := range slices.Sorted(maps.Keys(r.Groups)) {
				g := r.Groups[n]
				fmt.Fprintf(tw, "%s\t%gs\t%d\t%d\t%gh\n", n, g.WindowSeconds, g.MaxMessages, g.PenaltyThreshold, g.BlockHours)
			}
			return tw.Flush()
		},
	}
}

func (a *app) rlSetRules() *cobra.Command {
	var reason, file string
	var version int64
	var dry bool
	cmd := &cobra.Command{
		Use:   "set-rules --file GROUPS.json --version N",
		Short: "Replace the group rules, if still at --version (as rules printed it)",
		Long: `Replace the group rules of every schedule-consumer. GROUPS.json is the whole group map,
{"normal": {"window_seconds": 10, "max_messages": 5, "penalty_threshold": 3, "block_hours": 1}, …}.
The change is made only if the rules are still at --version: when someone changed them
since, it is refused (exit 4) with the current version; read them again and re-apply.`,
		Args: args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needReason(reason); err != nil {
				return err
			}
			if file == "" || version < 0 {
				return usagef("--file and --version (>= 0) are required")
			}
			raw, err := os.ReadFile(file)
			if err != nil {
				return usagef("--file: %v", err)
			}
			var groups map[string]console.RateRule
			if err := json.Unmarshal(raw, &groups); err != nil {
				return usagef("--file %s: not a JSON group map: %v", file, err)
			}
			if dry {
				if a.json() {
					return a.printValue(map[string]any{"dry_run": true, "would": "PUT /admin/ratelimit/rules", "version": version, "groups": groups})
				}
				fmt.Fprintf(a.out, "dry run: would replace the rules at version %d with %d group(s)\n", version, len(groups))
				return nil
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			data, err := c.do(cmd.Context(), "PUT", "/admin/ratelimit/rules", nil,
				map[string]any{"reason": reason, "version": version, "groups": groups})
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(data)
			}
			var ans struct {
				Version int64 `json:"version"`
			}
			if err := decode(data, &ans); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "done: rules replaced, now at version %d\n", ans.Version)
			return nil
		},
	}
	cmd.Flags().StringVar(&file, "file", "", "the group map, JSON")
	cmd.Flags().Int64Var(&version, "version", -1, "the version the change is made against")
	writeFlags(cmd, &reason, &dry)
	return cmd
}
