"""Questions over ``notes_docs/`` (7 documents written for this benchmark: a lab notebook, a cycling club's
committee minutes, a travel log, a household budget log, a yacht maintenance log, an allotment diary and an
on-call incident log).

Each entry: ``(question, document file, answer)`` where ``answer`` is a short phrase copied from the one
passage that answers the question; a chunk is relevant when it contains that phrase (whitespace folded). The
documents are dated entries that look alike (readings, amounts, hours, distances, weights), so the date or the
number decides which entry answers, and many questions have a near-miss: the three 12% ethanol readings, the
several impeller and oil jobs on the boat, the hostels of the travel log and of the club's tour, the incidents
of the same kind. The questions were written with the documents, before any retrieval was run on them, and were
not changed afterwards: about half paraphrase the entry ("why were all the cultures thrown away" for an
incubator at 36.5 °C), about a third name an exact term, name or number (INC-2054, SQ-2024-0193, Megan Price).
"""

QUESTIONS: list[tuple[str, str, str]] = [
    # lab_notebook.md
    ("what OD did YL-7 reach in 12% ethanol on the repeat with rubber stoppers", "lab_notebook.md",
     "the OD600 of YL-7 at 12% ethanol was 0.47"),
    ("why were all the cultures thrown away in late March", "lab_notebook.md",
     "temperature had risen to 36.5 °C overnight"),
    ("how many living wild-type cells per ml were left after 8 hours in 10% ethanol", "lab_notebook.md",
     "3.1 × 10⁷ viable cells per ml"),
    ("does the YL-7 advantage hold when there is less sugar in the medium", "lab_notebook.md",
     "At low glucose YL-7 overtakes YL-3"),
    ("sequencing order SQ-2024-0193", "lab_notebook.md", "order number SQ-2024-0193"),
    ("how did the evolved strain cope with heat", "lab_notebook.md", "YL-7 does poorly at 37 °C"),
    # club_minutes.md
    ("which supplier did the committee choose for the club jerseys", "club_minutes.md",
     "agreed to order from Hillside Sportswear"),
    ("how much is club membership in 2024", "club_minutes.md", "keep the fee at £25 per adult"),
    ("how much did the club's insurance go up", "club_minutes.md", "risen from £212 to £248"),
    ("who holds the Kestrel Hill climb record now", "club_minutes.md", "Megan Price in 5 minutes 9 seconds"),
    ("who took over as chair when Alan stepped down", "club_minutes.md", "Sunita Rao was elected chair unopposed"),
    ("how quick was the first Wednesday evening training ride", "club_minutes.md",
     "The average speed on the flat loop was 34.2 km/h"),
    # travel_log.md
    ("how long was the crossing to Orrin", "travel_log.md", "left Skelby at 10:15 and took 1 hour 50 minutes"),
    ("where did Hanna get a flat tyre", "travel_log.md", "Hanna had a puncture at 14:20 near Loch Varra"),
    ("what was the biggest day of riding on the trip", "travel_log.md", "The longest day: 88 km"),
    ("where did we sleep on the day of the gale", "travel_log.md", "took a room in the Kilbrae Inn, £84"),
    ("did we stay within budget on the islands trip", "travel_log.md", "Total spent on the trip: about £1,099"),
    ("what route did Joost and Marleen recommend", "travel_log.md", "recommended the west coast road on Dunmarra"),
    # household_budget.md
    ("how much did fixing the washing machine cost", "household_budget.md",
     "new drain pump, £145 including the call-out"),
    ("how much was the cheaper car insurance we switched to", "household_budget.md", "found the same cover for £689"),
    ("grocery spending in March", "household_budget.md", "groceries £664.90, petrol £101.75"),
    ("why did the energy direct debit go down", "household_budget.md",
     "meter reading showed we were £230 in credit"),
    ("what did Ava's birthday party cost altogether", "household_budget.md", "party bags £28. Total £135.40"),
    ("when are we seeing the mortgage adviser", "household_budget.md", "booked for 14 August at 17:30"),
    # boat_maintenance.md
    ("how much oil does Marram's engine take and what grade", "boat_maintenance.md", "1.3 litres of 10W-30"),
    ("why did the engine overheat coming back from Helston Cove", "boat_maintenance.md",
     "Found a plastic bag over the raw-water intake"),
    ("which through-hull valve was renewed over the winter", "boat_maintenance.md",
     "Replaced the cockpit drain seacock on the port side"),
    ("how much bottom paint went on the hull", "boat_maintenance.md", "2.5 litres in total"),
    ("what caused the vibration and clonk in reverse", "boat_maintenance.md",
     "play of about 2 mm in the cutless bearing"),
    ("engine hours when we set off for the Scilly Isles", "boat_maintenance.md",
     "Left the mooring at 05:30, engine hours 1,541"),
    # garden_diary.md
    ("how far apart did I plant the Charlotte seed potatoes", "garden_diary.md",
     "36 tubers, 30 cm apart in rows 60 cm apart"),
    ("what was the Sarpo Mira harvest", "garden_diary.md", "31.4 kg from 18 tubers"),
    ("what did I do when the potatoes got blight", "garden_diary.md", "Cut off and bagged all 'Charlotte' haulms"),
    ("hottest it got in the polytunnel this summer", "garden_diary.md", "Max in the polytunnel 34 °C at 14:00"),
    ("how did I deal with the aphids on the broad beans", "garden_diary.md", "Pinched out the tops of all plants"),
    ("why were the tomatoes splitting", "garden_diary.md", "fruits cracking after heavy watering"),
    # oncall_incident_log.md
    ("what caused the checkout 500 errors after the April deployment", "oncall_incident_log.md",
     "the migration job had been skipped"),
    ("how long were payments down when the database failed over", "oncall_incident_log.md",
     "resolved 20:37 (53 minutes)"),
    ("INC-2054", "oncall_incident_log.md", "certificate expired at 22:45"),
    ("why were customer refunds stuck on pending", "oncall_incident_log.md", "refund worker pool had shrunk to zero"),
    ("what did on-call do when the card acquirer started timing out", "oncall_incident_log.md",
     "switched card traffic to the backup acquirer at 14:21"),
    ("why did the checkout DNS fix take so long to work", "oncall_incident_log.md",
     "because of the 10-minute TTL on the record"),
]
