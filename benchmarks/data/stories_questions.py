"""Questions over ``stories_docs/`` (7 short stories written for this benchmark, each in its own place and
period: a Scottish lighthouse in 1894, a Lisbon tram in 1927, a Ghent dye workshop in 1349, an Osaka noodle shop
in a 1972 typhoon, a greenhouse on Mars, a small-town Iowa library in 1953, a Montreal snowplough at night).

Narrative: what happened, to whom, why and with what consequence. The stories share motifs so that questions
have near-misses in other stories: three storms (a gale, a typhoon, a blizzard), four gifts of thanks (a
telescope, opera tickets, a scarf, binoculars), three official reports, two daughters who could not take up
their fathers' trades, two failed machines (a lens's clockwork, a humidity sensor).

Each entry: ``(question, document file, answer)`` where ``answer`` is a short phrase copied from the one
passage that answers the question (judged as in ``everyday_questions``). The questions were written after the
stories and before any retrieval was run on them, and were not changed afterwards: about half paraphrase the
event ("what did she save first when the water came in" for "She reached for the stockpot"), about a third
name a character, place or number (Geeraard Mets, Carrick Skerry, sol 531).
"""

QUESTIONS: list[tuple[str, str, str]] = [
    # the_keepers_daughter.md
    ("what were the keepers supposed to do when the machine turning the lighthouse lens broke down",
     "the_keepers_daughter.md", "the keepers were to turn the lens by hand"),
    ("which ship nearly ran onto Carrick Skerry in the gale", "the_keepers_daughter.md",
     "it was the coaster Marram, out of Leith"),
    ("what present arrived for the lighthouse in the spring", "the_keepers_daughter.md",
     "a brass telescope in a leather case"),
    ("how did Hugh Baird break his arm", "the_keepers_daughter.md", "a squall took the boat onto the rocks"),
    ("what did the girl from the lighthouse do later in life", "the_keepers_daughter.md",
     "the first woman to sit on the harbour board"),
    ("what did the superintendent tell the Commissioners about the light", "the_keepers_daughter.md",
     "never once failed to show its character"),
    # the_violin_on_tram_28.md
    ("where exactly did the conductor find the instrument", "the_violin_on_tram_28.md",
     "on the back bench of car 28"),
    ("who told Joaquim where the Czech girl was lodging", "the_violin_on_tram_28.md",
     "it was the barber who finally said"),
    ("was the tram conductor punished for not taking the case to lost property?", "the_violin_on_tram_28.md",
     "docked half a day's pay"),
    ("how old was Hana Novotná's violin and who made it", "the_violin_on_tram_28.md",
     "made in 1790 by a village luthier in Bohemia"),
    ("how did the violinist thank him", "the_violin_on_tram_28.md",
     "two tickets for the opening night of the season"),
    ("what was on the card in the violin case", "the_violin_on_tram_28.md",
     "a note from her teacher in Brno wishing her luck"),
    ("why did he have to run the last part of the way to the opera house", "the_violin_on_tram_28.md",
     "a cart had lost a wheel across the rails"),
    # the_blue_of_ghent.md
    ("what secret had the master written over and over in the margins of his book", "the_blue_of_ghent.md",
     "wood ash from beech only, never oak"),
    ("how did the apprentice prove to the inspector that he had not used alum", "the_blue_of_ghent.md",
     "he dipped the white cloth into vat number seven"),
    ("who was Geeraard Mets", "the_blue_of_ghent.md", "a red dyer named Geeraard Mets"),
    ("how did Margriet run the workshop when women couldn't be masters", "the_blue_of_ghent.md",
     "ran the workshop under her husband's name"),
    ("what would happen if the cloths for Jacob Ruysch were late", "the_blue_of_ghent.md",
     "the debt takes the house"),
    ("how did the two rival dyers make peace", "the_blue_of_ghent.md",
     "lent him the money to buy madder from Zeeland"),
    # the_stockpot.md
    ("what was the first thing the noodle shop owner saved when the water came in", "the_stockpot.md",
     "She reached for the stockpot"),
    ("where did people in Tsuruhashi shelter on the night of the flood", "the_stockpot.md",
     "the Tsuruhashi middle school gymnasium was open as a shelter"),
    ("what did Fumiko make her son do before he left for Tokyo", "the_stockpot.md",
     "she made him taste the broth three times"),
    ("what goes into the Ishida Udon broth", "the_stockpot.md",
     "kelp from Rishiri, dried bonito shaved fresh every morning"),
    ("what did the man from the ward office recommend afterwards", "the_stockpot.md",
     "recommended that the canal be widened again"),
    ("what did the note sent with the pot say", "the_stockpot.md", "the side where it hit the stair"),
    # greenhouse_four.md
    ("what disease got into the potatoes on Mars", "greenhouse_four.md",
     "It was late blight, Phytophthora infestans"),
    ("how did they realise the humidity reading was wrong", "greenhouse_four.md",
     "No real sensor reads a perfectly flat line"),
    ("how much food did each person get while the new crop grew", "greenhouse_four.md",
     "about 1,900 calories per person per day"),
    ("how did they sterilise Greenhouse Four", "greenhouse_four.md", "sixty degrees for seventy-two hours"),
    ("what did Priya's report recommend for later stations", "greenhouse_four.md",
     "every station built after Tharsis: redundant sensors"),
    ("how big was the harvest weighed on sol 531", "greenhouse_four.md",
     "412 kilograms, the best crop the station had grown"),
    ("how did the commander end the fight over the peanut butter", "greenhouse_four.md",
     "Eklund settled by eating it himself"),
    # the_overdue_book.md
    ("when was the bird book originally borrowed", "the_overdue_book.md", "taken out on the ninth of May, 1931"),
    ("how much did the late fee on the bird guide come to", "the_overdue_book.md",
     "a little over one hundred and sixty-three dollars"),
    ("what was pressed between the pages of the returned book", "the_overdue_book.md",
     "a pressed feather, bright red"),
    ("did Margaret Holloway make the family pay the fine?", "the_overdue_book.md",
     "She said that the fine was waived"),
    ("what was the last bird Rolf saw before he went to war", "the_overdue_book.md",
     "The last entry was a cedar waxwing"),
    ("what club started because of the returned book", "the_overdue_book.md",
     "the first meeting of the Rolf Lindqvist Bird Club"),
    # night_plough.md
    ("why did the plough driver stop on Rue Rachel", "night_plough.md", "because one does not plough a dog"),
    ("how did she get the ambulance crew to the injured man", "night_plough.md",
     "she could bring the paramedics a path"),
    ("what did Mr. Abramowicz give Hélène to thank her", "night_plough.md", "a long scarf in red and grey wool"),
    ("what was the little dog called", "night_plough.md", "His collar tag said Bijou"),
    ("how much snow did the February storm bring", "night_plough.md",
     "forecast at forty centimetres and brought fifty-three"),
    ("what did her supervisor change in the night-shift rules", "night_plough.md",
     "clear an emergency path on a dispatcher's request"),
]
