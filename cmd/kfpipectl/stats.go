package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kfpipe/kfpipe/kf"
)

// statsDay is one account's day as stats prints it.
type statsDay struct {
	OpenKfID string           `json:"open_kfid"`
	Day      string           `json:"day"`
	Stat     kf.CorpStatistic `json:"statistic"`
}

func (a *app) statsCmd() *cobra.Command {
	var days int
	cmd := &cobra.Command{
		Use:   "stats [open_kfid...]",
		Short: "WeChat's statistics of each customer-service account, per day (get_corp_statistic)",
		Long: `The last --days days (default 7, at most 30) of WeChat's statistics per account:
sessions, customers, their messages, sessions the bot answered, customers handed to a
human. Without arguments every account the app may use (account/list). This command
asks WeChat itself, not the admin API: it reads KFPIPE_WECOM_CORP_ID and
KFPIPE_WECOM_SECRET (the daemons' variables) and KFPIPE_WECOM_BASE_URL (default
https://qyapi.weixin.qq.com). WeChat computes the figures once a day: today's row is
empty until tomorrow.`,
		RunE: func(cmd *cobra.Command, ids []string) error {
			if days < 1 || days > kf.MaxStatisticDays {
				return failf("--days must be 1 to %d, not %d", kf.MaxStatisticDays, days)
			}
			base := a.getenv("KFPIPE_WECOM_BASE_URL")
			if base == "" {
				base = "https://qyapi.weixin.qq.com"
			}
			corp, secret := a.getenv("KFPIPE_WECOM_CORP_ID"), a.getenv("KFPIPE_WECOM_SECRET")
			if corp == "" || secret == "" {
				return failf("stats asks WeChat: set KFPIPE_WECOM_CORP_ID and KFPIPE_WECOM_SECRET")
			}
			kc, err := kf.New(kf.Config{BaseURL: base, CorpID: corp, Secret: secret})
			if err != nil {
				return failf("%v", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), a.timeout)
			defer cancel()
			if len(ids) == 0 {
				accts, err := kc.Accounts(ctx)
				if err != nil {
					return failf("listing the accounts: %v", err)
				}
				for _, ac := range accts {
					ids = append(ids, ac.OpenKfID)
				}
			}
			to := time.Now()
			from := to.Add(-time.Duration(days-1) * 24 * time.Hour)
			var rows []statsDay
			for _, id := range ids {
				st, err := kc.CorpStatistics(ctx, id, from, to)
				if err != nil {
					return failf("statistics of %s: %v", id, err)
				}
				for _, d := range st {
					rows = append(rows, statsDay{OpenKfID: id, Day: d.Day.In(time.FixedZone("UTC+8", 8*3600)).Format(time.DateOnly), Stat: d})
				}
			}
			if a.json() {
				b, err := json.Marshal(rows)
				if err != nil {
					return err
				}
				return a.printJSON(b)
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ACCOUNT\tDAY\tSESSIONS\tCUSTOMERS\tCUSTOMER MSGS\tBOT ANSWERED\tTO A HUMAN")
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", r.OpenKfID, r.Day, r.Stat.SessionCount, r.Stat.CustomerCount,
					r.Stat.CustomerMsgCount, r.Stat.AISessionReplyCount, r.Stat.UpgradeServiceCount)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&days, "days", 7, "how many days back, today included (1 to 30)")
	return cmd
}
